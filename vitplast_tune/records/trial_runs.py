"""Keep one MLflow child run per trial: made as it starts, its curves logged at each report, closed as it ends."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from mlflow.entities import Dataset, DatasetInput, InputTag, RunTag
from mlflow.tracking import MlflowClient
from ray.tune import Callback

from vitplast_tune.components import component_flags, component_methods, method_label, subset_name
from vitplast_tune.config import FinetuneConfig, trial_config
from vitplast_tune.predictors import report
from vitplast_tune.predictors.scores import log_trainable_params
from vitplast_tune.records.table import error_line, trial_label
from vitplast_tune.records.tracking import (
    CURVE_METRICS,
    DEVICE_TAG,
    FAILURE_TAG,
    FINAL_METRICS,
    PARENT_TAG,
    PRECISION_TAG,
    ROLE_TAG,
    RUN_NAME_TAG,
    SEARCH_TAG,
    SEED_TAG,
    STAGE_TAG,
    TRIAL_TAG,
    WORKER_NODES_TAG,
    WORKERS_TAG,
    child_runs,
    client,
    is_number,
    log_inputs,
    log_metrics,
    log_params,
    number_or,
    param_texts,
    source_tags,
    trial_runs,
)
from vitplast_tune.space.baselines import SEARCH, stage_of

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

EARLIER_TRIAL_TAG = "vitplast.earlier_trial_id"  # on a run a resumed trial continued: the trial id it was made for
SUPERSEDED_TAG = "vitplast.superseded"  # on a run removed by a resume: why (its trial was never saved by Tune)


@dataclass
class TrialRun:
    """What a trial's child run starts with: its name, params, start metrics, tags and dataset inputs."""

    name: str
    params: dict[str, Any]
    metrics: dict[str, float]
    tags: dict[str, str] = field(default_factory=dict)
    inputs: list[DatasetInput] = field(default_factory=list)


def dataset_inputs(cfg: FinetuneConfig) -> list[DatasetInput]:
    """Describe the training and validation splits a trial uses as MLflow dataset inputs."""
    name, seed, fraction = cfg.dataset, cfg.seed, cfg.val_fraction
    source = json.dumps({"dataset": name, "data_dir": cfg.data_dir})
    inputs = []
    for context, split in (("training", "train"), ("validation", "val")):
        identity = f"{name}:{split}:seed={seed}:val_fraction={fraction}"
        digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
        profile = json.dumps({"split": split, "seed": seed, "val_fraction": fraction})
        dataset = Dataset(
            name=f"{name}-{split}", digest=digest, source_type="vitplast_tune", source=source, profile=profile
        )
        inputs.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)]))
    return inputs


class MlflowTracker(Callback):
    """A Tune callback that keeps one MLflow child run per trial under the search's parent run.

    Args:
        tracking_uri: The MLflow tracking URI.
        parent_run_id: The id of the search's parent run.
        describe: Makes the ``TrialRun`` a trial's child run starts with, from its config.
        orphans: Runs of trials Tune never saved, by run id, with their params (``reconcile``). A trial of the same
            settings continues one instead of making a new run.
    """

    def __init__(
        self,
        tracking_uri: str,
        parent_run_id: str,
        describe: Callable[[dict[str, Any]], TrialRun],
        orphans: dict[str, dict[str, str]] | None = None,
    ):
        self.tracking_uri = tracking_uri
        self.parent_run_id = parent_run_id
        self.describe = describe
        self.orphans = orphans if orphans is not None else {}  # run id -> params: runs of trials Tune never saved
        self.runs: dict[str, str] = {}
        self._mlflow: MlflowClient | None = None
        self._experiment: str | None = None  # the parent's experiment, read with the runs made before
        self._tagged_node: dict[str, tuple] = {}  # trial id -> (node ip, node id, device, precision) last tagged

    @property
    def mlflow(self) -> MlflowClient:
        if self._mlflow is None:
            self._mlflow = client(self.tracking_uri)
        return self._mlflow

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_mlflow": None, "_experiment": None}

    def run_id(self, trial: Trial, number: int | None = None) -> str:
        """Find or make the trial's child run: the one made before, else an orphan of the same settings, else a new one.

        Args:
            trial: The Tune trial.
            number: The trial's number in the search, in a new run's name (None: its trial id).

        Returns:
            The child run's id.
        """
        if trial.trial_id in self.runs:
            return self.runs[trial.trial_id]
        if self._experiment is None:
            self._experiment = self.mlflow.get_run(self.parent_run_id).info.experiment_id
            for trial_id, found in trial_runs(self.mlflow, self.parent_run_id).items():
                self.runs.setdefault(trial_id, found)  # the same dict: others read it (run.live_study)
        run_id = self.runs.get(trial.trial_id)
        described = self.describe(trial.config) if run_id is None else None
        if described is not None:  # a run of the same settings a killed driver made for a trial Tune never saved
            run_id = self._adopt(trial.trial_id, param_texts(described.params))
        if run_id is not None:
            self.mlflow.update_run(run_id, status="RUNNING")
        else:
            assert described is not None
            tags = {
                **described.tags,
                PARENT_TAG: self.parent_run_id,
                TRIAL_TAG: trial.trial_id,
                RUN_NAME_TAG: f"{described.name} #{number or trial.trial_id}",
            }
            run_id = self.mlflow.create_run(self._experiment, tags=tags).info.run_id
            log_params(self.mlflow, run_id, described.params)
            log_metrics(self.mlflow, run_id, described.metrics)
            if described.inputs:
                log_inputs(self.mlflow, run_id, described.inputs)
        self.runs[trial.trial_id] = run_id
        return run_id

    def _adopt(self, trial_id: str, params: dict[str, str]) -> str | None:
        """Take up the orphaned run whose params are ``params`` as the run of ``trial_id``; None when there is none."""
        for run_id, logged in list(self.orphans.items()):
            if all(logged.get(k) == v for k, v in params.items()):
                del self.orphans[run_id]
                earlier = logged.get(TRIAL_TAG, "")
                tags = {TRIAL_TAG: trial_id, **({EARLIER_TRIAL_TAG: earlier} if earlier else {})}
                self.mlflow.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
                return run_id
        return None

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Make (or find) the child run of a trial that starts."""
        self.run_id(trial, number=trials.index(trial) + 1 if trial in trials else None)

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info: Any) -> None:
        """Log a trial's report to its child run: its curves, and the node it runs on as tags when that changed."""
        run_id = self.run_id(trial)
        step = int(result.get("step", result.get("training_iteration", 0)))
        log_metrics(self.mlflow, run_id, {**{k: result.get(k) for k in CURVE_METRICS}, **_live_metrics(result)}, step)
        node = tuple(result.get(k) for k in ("node_ip", "node_id", "device", "precision", "workers", "worker_node_ids"))
        if result.get("node_ip") and self._tagged_node.get(trial.trial_id) != node:  # again when a retry moved it
            keys = ("ray.node_ip", "ray.node_id", DEVICE_TAG, PRECISION_TAG, WORKERS_TAG, WORKER_NODES_TAG)
            tags = {**dict(zip(keys, node)), "ray.hostname": result.get("hostname")}
            self.mlflow.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items() if v])
            self._tagged_node[trial.trial_id] = node

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Close a finished trial's child run: FINISHED with its final metrics, or FAILED when it diverged."""
        run_id = self.run_id(trial)
        last = trial.last_result or {}
        if last.get("diverged"):
            self.mlflow.set_tag(run_id, FAILURE_TAG, str(last.get("error", "diverged")))
            self.mlflow.set_terminated(run_id, status="FAILED")
            return
        final = {"final_val_acc": last.get("val_acc"), "test_acc": last.get("test_acc"), "final_step": last.get("step")}
        log_metrics(self.mlflow, run_id, final, int(last.get("step", 0)))
        self.mlflow.set_tag(run_id, "stopped_early", str(int(last.get("step", 0)) < int(last.get("max_steps", 0))))
        self.mlflow.set_terminated(run_id, status="FINISHED")

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Close a crashed trial's child run FAILED, tagged with the error's line."""
        run_id = self.run_id(trial)
        reason = _error_text(trial)
        self.mlflow.set_tag(run_id, FAILURE_TAG, reason)
        self.mlflow.set_terminated(run_id, status="FAILED")

    def get_state(self) -> dict:
        return {"runs": dict(self.runs)}

    def set_state(self, state: dict) -> None:
        self.runs.update(state.get("runs", {}))


def reconcile(mlflow: MlflowClient, parent_run_id: str, saved: dict[str, str]) -> dict[str, dict[str, str]]:
    """Check a resumed search's child runs against the trials Tune saved (``saved``: id -> status).

    A run left RUNNING after its trial ended is closed. A run whose trial Tune never saved is closed KILLED and
    returned as an orphan (run id -> its params and trial id), for a trial of the same settings to continue.
    """
    orphans: dict[str, dict[str, str]] = {}
    for run in child_runs(mlflow, parent_run_id):
        trial, status = run.data.tags.get(TRIAL_TAG), run.info.status
        ended = saved.get(trial or "")
        if trial not in saved:
            if status == "RUNNING":
                mlflow.set_terminated(run.info.run_id, status="KILLED")
            orphans[run.info.run_id] = {**run.data.params, TRIAL_TAG: trial or ""}
        elif status == "RUNNING" and ended in ("TERMINATED", "ERROR"):
            mlflow.set_terminated(run.info.run_id, status="FINISHED" if ended == "TERMINATED" else "FAILED")
    return orphans


def retire(mlflow: MlflowClient, orphans: dict[str, dict[str, str]]) -> None:
    """Delete the orphaned runs no trial took up, each tagged with why (``mlflow gc`` purges them)."""
    for run_id, logged in list(orphans.items()):
        if mlflow.get_run(run_id).data.tags.get(TRIAL_TAG, "") == logged.get(TRIAL_TAG, ""):  # not taken up since
            mlflow.set_tag(run_id, SUPERSEDED_TAG, "its trial was never saved by Tune (the driver was killed)")
            mlflow.delete_run(run_id)
        del orphans[run_id]


def _live_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """Pick what the view plots from one report; the latest ``val_acc`` stands in for ``val_acc_common``."""
    params = result.get("trainable_params")
    log10 = log_trainable_params(params) if is_number(params) else None  # NaN for a count of 0: not logged
    return {"val_acc_common": result.get("val_acc"), "trainable_params": params, "log10_trainable_params": log10}


def trial_describer(search: str, settings: FinetuneConfig, predictors: report.Predictors):
    """Make the function that names a trial's child run and gives its params, scores and tags."""
    source = source_tags()

    def describe(config: dict[str, Any]) -> TrialRun:
        cfg = trial_config(config, settings)
        subset = subset_name(cfg.components)
        params = {
            **cfg.to_dict(),
            "components": subset,
            "method": method_label(subset),
            **component_flags(subset),
            **component_methods(subset),
        }
        label = trial_label({"components": subset, "depth": cfg.depth, "lr": cfg.lr})
        name = label + (f" seed={cfg.seed}" if "seed" in config else "")
        name += f" steps={cfg.max_steps}" if "max_steps" in config else ""
        stage = stage_of(config)
        name += f" ({stage})" if stage != SEARCH else ""
        n_components = sum(component_flags(subset).values())
        metrics = {**predictors.trial_scores(cfg), "n_components": n_components, "log10_lr": math.log10(cfg.lr)}
        tags = {**source, SEARCH_TAG: search, ROLE_TAG: "trial", STAGE_TAG: stage, SEED_TAG: str(cfg.seed)}
        return TrialRun(name, params, metrics, tags, dataset_inputs(cfg))

    return describe


def log_trial_finals(mlflow: MlflowClient, trials: pd.DataFrame, timestamp_ms: int | None = None) -> None:
    """Log the values known only after the search on each trial's run, at one time that a resume logs again."""
    for row in trials.itertuples(index=False):
        run_id = getattr(row, "run_id", None)
        if isinstance(run_id, str) and run_id:
            finals = {k: getattr(row, k, None) for k in FINAL_METRICS}
            log_metrics(mlflow, run_id, finals, int(number_or(row.step, 0)), timestamp_ms)


def _error_text(trial) -> str:
    path = getattr(trial, "error_file", None)
    return error_line(Path(path).read_text()) if path and Path(path).is_file() else "error"
