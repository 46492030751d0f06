"""MLflow records of a search, written from the driver: a parent run per search, a child per trial,
and what goes into each (params, tags, metrics, artifacts).

Logging from a Tune callback on the driver (not inside trials) works wherever trials run, with a
SQLite store on the head node or an ``mlflow server``. Runs are found again by tags, so a resumed
search continues its runs instead of duplicating them.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pandas as pd
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.tracking.context.registry import resolve_tags
from ray.tune import Callback

from vitplast_tune import storage
from vitplast_tune.components import method_label, subset_name
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.predictors import report
from vitplast_tune.predictors.scores import criteria_summary
from vitplast_tune.search import distributions, mlflow_view, results
from vitplast_tune.search.plan import SearchPlan
from vitplast_tune.search.trial import trial_config
from vitplast_tune.storage import BEST_TRIAL_DIR, MODEL_NAME, TRIAL_FILE, WEIGHTS_DIR, WEIGHTS_FILE, is_uri

SEARCH_TAG = mlflow_view.SEARCH_TAG
ROLE_TAG = mlflow_view.ROLE_TAG  # "search" on the parent run, "trial" on each child: filter by it
SEARCH_ID_TAG = "vitplast.search_id"  # unique per search: a shared server may hold several searches of one name
STORAGE_TAG = "vitplast.storage"
DEVICE_TAG = "vitplast.device"  # where a trial trained: "cpu" or "cuda:0 <the GPU's name>"
PRECISION_TAG = "vitplast.precision"  # what it computed in: fp32, bf16 or fp16
WORKERS_TAG = "vitplast.workers"  # how many data-parallel workers trained it (search/parallel.py)
FAILURE_TAG = "failure_reason"
TRIAL_TAG = "ray.trial_id"
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
NOTE_TAG = "mlflow.note.content"  # the run's description in the UI (Markdown)
VIEW_LINK_TAG = "vitplast.view_link"
STUDY_TAG = "vitplast.optuna_study"  # the search's Optuna study: its storage URL and name (search/study.py)
BEST_TAG = "vitplast.best"  # "true" on the best trial's run
BEST_RUN_TAG = "vitplast.best_run_id"  # on the parent run: the best trial's run
CURVE_METRICS = ("train_loss", "val_acc", "val_loss", "best_val_acc", "current_lr", "steps_per_s", "images_per_s")
# Logged once per trial after the search, from the trial table (results.trial_table).
FINAL_METRICS = ("val_acc_common", "common_step", "trainable_params", "log10_trainable_params", "best_val_loss")
BEST_WEIGHTS = f"{BEST_TRIAL_DIR}/{WEIGHTS_FILE}"
ARTIFACTS_DIR = "mlartifacts"  # beside a SQLite store: one folder per experiment
_MAX_PARAM = 6000


@dataclass
class TrialRun:
    """What a trial's child run starts with: its name, params, start metrics, tags and dataset inputs."""

    name: str
    params: dict[str, Any]
    metrics: dict[str, float]
    tags: dict[str, str] = field(default_factory=dict)
    inputs: list[DatasetInput] = field(default_factory=list)


def client(tracking_uri: str) -> MlflowClient:
    """An MLflow client for ``tracking_uri`` (e.g. ``sqlite:///path/mlflow.db`` or ``http://127.0.0.1:5000``)."""
    return MlflowClient(tracking_uri=tracking_uri)


def experiment_id(mlflow: MlflowClient, name: str, artifact_location: str | None = None) -> str:
    """Id of the experiment ``name``, created when missing (its artifacts at ``artifact_location``: see
    ``artifact_location``; an existing experiment keeps the location it was created with)."""
    experiment = mlflow.get_experiment_by_name(name)
    if experiment:
        return experiment.experiment_id
    return mlflow.create_experiment(name, artifact_location=artifact_location)


def artifact_location(tracking_uri: str, experiment: str, storage: str) -> str | None:
    """Where a new experiment keeps its artifacts, never the working directory (MLflow's default ``./mlruns``): beside
    a SQLite store (``<its folder>/mlartifacts/<experiment>``); the server's choice for http(s) and Databricks (None);
    the file store's own folder for ``file:`` (None); under the search storage for other databases."""
    scheme = urlsplit(tracking_uri).scheme.lower()
    folder = _folder_name(experiment)
    database = tracking_uri.split(":///", 1)[1].split("?")[0] if tracking_uri.startswith("sqlite:///") else ""
    if scheme == "sqlite" and database and database != ":memory:":
        return str(Path(database).expanduser().resolve().parent / ARTIFACTS_DIR / folder)
    if scheme in ("http", "https", "databricks", "file", ""):
        return None
    root = storage if is_uri(storage) else str(Path(storage).expanduser().resolve())
    return f"{root.rstrip('/')}/{ARTIFACTS_DIR}/{folder}"


def _folder_name(experiment: str) -> str:
    """A folder name for an experiment: its name when that is safe, else a safe form with a hash of the name (never
    digits alone, which an ``mlflow server``'s own experiment folders use)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", experiment).strip("-.") or "experiment"
    if safe != experiment or safe.isdigit():
        safe = f"{safe}-{hashlib.sha256(experiment.encode()).hexdigest()[:8]}"
    return safe


def find_search_run(
    mlflow: MlflowClient, experiment: str, search: str, search_id: str | None = None, storage: str | None = None
) -> str | None:
    """Run id of the parent run of search ``search`` (narrowed to its unique id or its storage when given), or None."""
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return None
    tags = {
        SEARCH_TAG: search,
        ROLE_TAG: "search",
        SEARCH_ID_TAG: search_id,
        STORAGE_TAG: storage,
    }  # trials carry the name too
    where = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items() if v)
    runs = mlflow.search_runs([exp.experiment_id], filter_string=where, max_results=2)
    return runs[0].info.run_id if len(runs) == 1 else None


def mark_failed(mlflow: MlflowClient, run_id: str, error: BaseException | str) -> None:
    """End a run as FAILED with the reason (the error's first line) in its ``failure_reason`` tag."""
    lines = str(error).strip().splitlines()
    reason = f"{type(error).__name__}: {lines[0] if lines else ''}" if isinstance(error, BaseException) else str(error)
    mlflow.set_tag(run_id, FAILURE_TAG, reason[:500])
    mlflow.set_terminated(run_id, status="FAILED")


def close_trials(mlflow: MlflowClient, parent_run_id: str, status: str = "KILLED") -> None:
    """End every trial run of a search that is still RUNNING with ``status`` (the search stopped under it)."""
    for run in child_runs(mlflow, parent_run_id):
        if run.info.status == "RUNNING":
            mlflow.set_terminated(run.info.run_id, status=status)


def close_search(mlflow: MlflowClient, parent_run_id: str, status: str = "KILLED") -> None:
    """End a stopped search's parent run and its trial runs still RUNNING with ``status``; ``--resume`` reopens them."""
    close_trials(mlflow, parent_run_id, status)
    mlflow.set_terminated(parent_run_id, status=status)


def start_search_run(
    mlflow: MlflowClient,
    experiment: str,
    search: str,
    params: dict[str, Any],
    tags: dict[str, str],
    artifacts: str | None = None,
) -> str:
    """Create the parent run of a search with its params and tags (and the source tags) in ``experiment`` (created
    with its artifacts at ``artifacts`` when missing); return its id."""
    tags = {**source_tags(), SEARCH_TAG: search, ROLE_TAG: "search", **tags}
    run = mlflow.create_run(experiment_id(mlflow, experiment, artifacts), run_name=search, tags=tags)
    log_params(mlflow, run.info.run_id, params)
    return run.info.run_id


def source_tags() -> dict[str, str]:
    """MLflow's source tags for runs made through the client: entry point, git commit (in a git repo), user."""
    name = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-", "-c") else "vitplast_tune"
    tags = resolve_tags({"mlflow.source.name": name})
    return {k: str(v) for k, v in tags.items() if k.startswith(("mlflow.source.", "mlflow.user"))}


def dataset_inputs(cfg: FinetuneConfig) -> list[DatasetInput]:
    """The training and validation splits a trial uses, as MLflow dataset inputs (the UI's Dataset column)."""
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


def log_params(mlflow: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    """Log params (values as strings, None skipped) in one batch."""
    batch = [Param(k, _param_text(v)) for k, v in params.items() if v is not None]
    for i in range(0, len(batch), 100):
        mlflow.log_batch(run_id, params=batch[i : i + 100])


def log_metrics(mlflow: MlflowClient, run_id: str, metrics: dict[str, Any], step: int = 0) -> None:
    """Log the finite numeric values of ``metrics`` at ``step`` in one batch."""
    now = _now_ms()
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if _is_number(v)]
    if batch:
        mlflow.log_batch(run_id, metrics=batch)


class MlflowTracker(Callback):
    """Tune callback: one MLflow child run per trial under the search's parent run.

    ``describe(config)`` returns the ``TrialRun`` of a trial (name, params, start metrics such as the
    subset's plasticity scores, tags, dataset inputs; see ``trial_describer``), so this class knows
    nothing of training.
    """

    def __init__(self, tracking_uri: str, parent_run_id: str, describe: Callable[[dict[str, Any]], TrialRun]):
        self.tracking_uri = tracking_uri
        self.parent_run_id = parent_run_id
        self.describe = describe
        self.runs: dict[str, str] = {}
        self._mlflow: MlflowClient | None = None
        self._tagged_node: dict[str, tuple] = {}  # trial id -> (node ip, node id, device, precision) last tagged

    @property
    def mlflow(self) -> MlflowClient:
        if self._mlflow is None:
            self._mlflow = client(self.tracking_uri)
        return self._mlflow

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_mlflow": None}

    def run_id(self, trial, number: int | None = None) -> str:
        """The trial's child run: the one already made (also by an earlier driver), else a new one."""
        if trial.trial_id in self.runs:
            return self.runs[trial.trial_id]
        parent = self.mlflow.get_run(self.parent_run_id)
        found = self.mlflow.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.`{TRIAL_TAG}` = '{trial.trial_id}' and tags.`{PARENT_TAG}` = '{self.parent_run_id}'",
            max_results=1,
        )
        if found:
            run_id = found[0].info.run_id
            self.mlflow.update_run(run_id, status="RUNNING")
        else:
            described = self.describe(trial.config)
            tags = {
                **described.tags,
                PARENT_TAG: self.parent_run_id,
                TRIAL_TAG: trial.trial_id,
                RUN_NAME_TAG: f"{described.name} #{number or trial.trial_id}",
            }
            run_id = self.mlflow.create_run(parent.info.experiment_id, tags=tags).info.run_id
            log_params(self.mlflow, run_id, described.params)
            log_metrics(self.mlflow, run_id, described.metrics)
            if described.inputs:
                self.mlflow.log_inputs(run_id, datasets=described.inputs)
        self.runs[trial.trial_id] = run_id
        return run_id

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        self.run_id(trial, number=trials.index(trial) + 1 if trial in trials else None)

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        run_id = self.run_id(trial)
        step = int(result.get("step", result.get("training_iteration", 0)))
        log_metrics(self.mlflow, run_id, {**{k: result.get(k) for k in CURVE_METRICS}, **live_metrics(result)}, step)
        node = tuple(result.get(k) for k in ("node_ip", "node_id", "device", "precision", "workers"))
        if result.get("node_ip") and self._tagged_node.get(trial.trial_id) != node:  # again when a retry moved it
            keys = ("ray.node_ip", "ray.node_id", DEVICE_TAG, PRECISION_TAG, WORKERS_TAG)
            tags = {**dict(zip(keys, node)), "ray.hostname": result.get("hostname")}
            self.mlflow.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items() if v])
            self._tagged_node[trial.trial_id] = node

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        run_id = self.run_id(trial)
        last = trial.last_result or {}
        if last.get("diverged"):
            self.mlflow.set_tag(run_id, "failure_reason", str(last.get("error", "diverged")))
            self.mlflow.set_terminated(run_id, status="FAILED")
            return
        final = {"final_val_acc": last.get("val_acc"), "test_acc": last.get("test_acc"), "final_step": last.get("step")}
        log_metrics(self.mlflow, run_id, final, int(last.get("step", 0)))
        self.mlflow.set_tag(run_id, "stopped_early", str(int(last.get("step", 0)) < int(last.get("max_steps", 0))))
        self.mlflow.set_terminated(run_id, status="FINISHED")

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        run_id = self.run_id(trial)
        reason = _error_text(trial)
        self.mlflow.set_tag(run_id, FAILURE_TAG, reason)
        self.mlflow.set_terminated(run_id, status="FAILED")

    def get_state(self) -> dict:
        return {"runs": dict(self.runs)}

    def set_state(self, state: dict) -> None:
        self.runs.update(state.get("runs", {}))


def live_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """What the search's view plots, from one report, so that its charts fill in while trials run: the trial's
    latest ``val_acc`` as ``val_acc_common`` (replaced by the accuracy at the common step when the search ends, see
    ``log_trial_finals``), ``trainable_params`` and its log10."""
    params = result.get("trainable_params")
    log10 = math.log10(params) if _is_number(params) and params > 0 else None
    return {"val_acc_common": result.get("val_acc"), "trainable_params": params, "log10_trainable_params": log10}


def open_search_run(mlflow: MlflowClient, plan: SearchPlan, predictors: report.Predictors) -> str:
    """The parent run of a search: found again on ``--resume``, else created with the space, settings and plasticity."""
    if plan.options.resume:
        existing = find_search_run(
            mlflow,
            plan.experiment,
            plan.name,
            search_id=plan.search_id or None,
            storage=None if plan.search_id else plan.location,
        )
        if existing:
            mlflow.update_run(existing, status="RUNNING")
            return existing
    spec = plan.spec
    params = {
        "space": spec.name,
        "algorithm": spec.algorithm,
        "scheduler": spec.scheduler.name,
        "num_samples": spec.num_samples,
        "metric": spec.metric,
        "mode": spec.mode,
        "search_seed": plan.seed,
        "augment": results.augmentation_text(plan).removeprefix("augmentation "),
        **{f"default.{k}": v for k, v in plan.settings.to_dict().items()},
    }
    tags = {
        "vitplast.space_fingerprint": spec.fingerprint,
        STORAGE_TAG: plan.location,
        SEARCH_ID_TAG: plan.search_id,
        NOTE_TAG: search_note(plan.name),
    }
    plasticity = predictors.plasticity
    if plasticity is not None:
        meta = plasticity.meta
        params.update(
            plasticity_variant=meta["variant"], plasticity_reference=meta["reference"], plasticity_pairs=meta["n_pairs"]
        )
    artifacts = artifact_location(plan.tracking_uri, plan.experiment, plan.storage)
    run_id = start_search_run(mlflow, plan.experiment, plan.name, params, tags, artifacts)
    mlflow.log_text(run_id, spec.text, f"space/{spec.path.name}")
    if predictors.gradients is not None:
        mlflow.log_text(run_id, predictors.gradients.to_csv(index=False), "criteria/gradients.csv")
        summary = criteria_summary(predictors.gradients)
        mlflow.log_text(run_id, summary.to_csv(index=False), "criteria/gradients_summary.csv")
    if plasticity is not None:
        log_artifacts(mlflow, run_id, plasticity.files.values(), "plasticity")
        mlflow.log_table(run_id, plasticity.ranking, "plasticity/ranking.json")
    return run_id


def search_note(search: str, link: str | None = None, note: str = "") -> str:
    """The parent run's description (Markdown): what the search's runs and metrics are, and the view's link."""
    lines = [
        f"**Search `{search}`**: one child run per trial (tag `{ROLE_TAG}` = `trial`); this run (`search`) holds "
        "the search-wide settings (params `default.*`), the plasticity table and the analysis."
    ]
    if link:
        lines += ["", f"[Open the trials view]({link}) (trials sorted by accuracy at the common step, with charts)."]
    if note:
        lines += ["", note]
    lines += [
        "",
        "Metrics: `best_val_acc` (best validation accuracy of the best trial), `best_test_acc` (test accuracy "
        "of that trial's best-validation weights), `num_trials`. Trials: `val_acc_common` is the validation "
        "accuracy at `common_step`, the last evaluation every trial reached (the fair comparison under early "
        "stopping); `plasticity_mean` is the subset's mean plasticity; `trainable_params` and its log10.",
        "",
        "Artifacts: `analysis/correlations.json` (Spearman and Kendall of plasticity and of log trainable "
        "parameters with accuracy, bootstrap 95% intervals), plots, `trials.csv`, "
        f"`{BEST_WEIGHTS}` (the best trial's trained parameters, beside its settings in "
        f"`{BEST_TRIAL_DIR}/{TRIAL_FILE}`; its own run is tagged `{BEST_TAG}` = `true`).",
        "",
        f'The best model: `mlflow.pytorch.load_model("runs:/<this run\'s id>/{MODEL_NAME}")`, or '
        f'`vitplast_tune.load_best_model("{search}", storage=...)`.',
    ]
    return "\n".join(lines)


def publish_view(mlflow: MlflowClient, plan: SearchPlan, run_id: str, plasticity: bool) -> mlflow_view.View:
    """Save the search's MLflow UI view, and its link on the parent run (tag and description)."""
    experiment = mlflow.get_run(run_id).info.experiment_id
    view = mlflow_view.publish(mlflow, experiment, plan.name, plasticity, mlflow_view.ui_base_url(plan.tracking_uri))
    tags = {VIEW_LINK_TAG: view.link, NOTE_TAG: search_note(plan.name, view.link, view.note)}
    mlflow.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    return view


def trial_describer(plan: SearchPlan, predictors: report.Predictors):
    """The function that names a trial's child run and gives its params and predictor scores (see MlflowTracker)."""
    settings, source = plan.settings, source_tags()

    def describe(config: dict[str, Any]) -> TrialRun:
        cfg = trial_config(config, settings)
        subset = subset_name(cfg.components)
        params = {
            **cfg.to_dict(),
            "components": subset,
            "method": method_label(subset),
            **distributions.component_flags(subset),
            **distributions.component_methods(subset),
        }
        label = results.trial_label({"components": subset, "depth": cfg.depth, "lr": cfg.lr})
        name = label + (f" seed={cfg.seed}" if "seed" in config else "")
        name += f" steps={cfg.max_steps}" if "max_steps" in config else ""
        n_components = sum(distributions.component_flags(subset).values())
        metrics = {**predictors.trial_scores(cfg), "n_components": n_components, "log10_lr": math.log10(cfg.lr)}
        tags = {**source, SEARCH_TAG: plan.name, ROLE_TAG: "trial"}
        return TrialRun(name, params, metrics, tags, dataset_inputs(cfg))

    return describe


def log_results(mlflow: MlflowClient, run_id: str, trials_csv: Path, best: pd.DataFrame, num_trials: int) -> None:
    """The trial table (CSV, and a table the UI shows with ids as text) and the headline metrics on the parent run."""
    log_artifacts(mlflow, run_id, [trials_csv])
    mlflow.log_table(run_id, results.read_trials(trials_csv.parent), "trials.json")
    if not best.empty:
        top = best.iloc[0]
        log_metrics(
            mlflow,
            run_id,
            {"best_val_acc": top["best_val_acc"], "best_test_acc": top.get("test_acc"), "num_trials": num_trials},
        )


def log_analysis(mlflow: MlflowClient, run_id: str, found) -> None:
    """An ``analysis.SearchAnalysis`` on the parent run: its tables (every column) and its files."""
    if found.trials is not None:
        mlflow.log_table(run_id, found.trials.correlations, "analysis/correlations.json")
    if found.paper is not None:
        mlflow.log_table(run_id, found.paper.table, "analysis/paper_table.json")
    if found.criteria is not None:
        mlflow.log_table(run_id, found.criteria, "analysis/criteria.json")
    if found.importance is not None and not found.importance.table.empty:
        mlflow.log_table(run_id, found.importance.table, "analysis/importance.json")
    if found.depth is not None:
        mlflow.log_table(run_id, found.depth.table, "analysis/depth_table.json")
    log_artifacts(mlflow, run_id, found.files, "analysis")


def log_pareto(mlflow: MlflowClient, run_id: str, files: Iterable[Path]) -> None:
    """The Pareto fronts (``results.write_pareto``: CSV and PNG per axis) on the parent run, under ``pareto/``."""
    log_artifacts(mlflow, run_id, files, "pareto")


def trial_runs(mlflow: MlflowClient, parent_run_id: str) -> dict[str, str]:
    """The child run id of each trial id of a search."""
    runs = child_runs(mlflow, parent_run_id)
    return {run.data.tags[TRIAL_TAG]: run.info.run_id for run in runs if TRIAL_TAG in run.data.tags}


def log_trial_finals(mlflow: MlflowClient, trials: pd.DataFrame) -> None:
    """The values known only after the search (``FINAL_METRICS`` of the trial table) on each trial's run, once."""
    for row in trials.itertuples(index=False):
        run_id = getattr(row, "run_id", None)
        if isinstance(run_id, str) and run_id:
            log_metrics(mlflow, run_id, {k: getattr(row, k, None) for k in FINAL_METRICS}, int(_number(row.step, 0)))


def log_best_trial(
    mlflow: MlflowClient, plan: SearchPlan, parent_run_id: str, result, row: dict[str, Any]
) -> tuple[str | None, str]:
    """The best trial of a finished search on MLflow; return its model's URI (``runs:/<parent>/best_model``, None
    when the model could not be rebuilt here) and a note saying why not.

    ``result`` is its Tune result (config, last checkpoint), ``row`` its row of the trial table. Its best-validation
    weights (the trainable tensors, safetensors) and settings (``trial.json``) go to the parent run (``best_trial/``)
    and to the trial's own run (``weights/``, tagged ``vitplast.best``); the model rebuilt with them is logged as the
    parent's MLflow model. The weights are read from the trial's last checkpoint through the checkpoint's own
    filesystem (the search's storage: a local path or s3://...), wherever the trial ran: only that file, not the
    optimizer state. Torch loads here, on the driver, after every trial has finished.
    """
    from safetensors.torch import load_file

    cfg = trial_config(result.config or {}, plan.settings)
    run_id = row.get("run_id") if isinstance(row.get("run_id"), str) else None
    with tempfile.TemporaryDirectory() as directory:
        files = [Path(directory) / WEIGHTS_FILE, Path(directory) / TRIAL_FILE]
        best_weights(result.checkpoint, files[0])
        weights = load_file(str(files[0]))
        files[1].write_text(json.dumps({**row, "settings": cfg.to_dict()}, indent=2, default=str))
        log_artifacts(mlflow, parent_run_id, files, BEST_TRIAL_DIR)
        if run_id:
            log_artifacts(mlflow, run_id, files, WEIGHTS_DIR)
            mlflow.set_tag(run_id, BEST_TAG, "true")
            mlflow.set_tag(parent_run_id, BEST_RUN_TAG, run_id)
    return log_best_model(plan, parent_run_id, cfg, weights)


def best_weights(checkpoint, path: Path) -> None:
    """The best-validation trainable weights of a trial's checkpoint as the safetensors file ``path``."""
    from vitplast_tune.search.trial import BEST_FILE

    try:
        storage.download(checkpoint.filesystem, f"{checkpoint.path}/{BEST_FILE}", path.parent).rename(path)
    except FileNotFoundError:  # a checkpoint written before best.safetensors: the best weights in state.pt
        _best_from_state(checkpoint, path)


def _best_from_state(checkpoint, path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from vitplast_tune.search.trial import STATE_FILE

    with checkpoint.as_directory() as source:
        # Memory-mapped: only the best weights are read, not the optimizer state and the last weights beside them.
        state = torch.load(Path(source) / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
        best = state.get("best", {}).get("trainable") or state["trainable"]
        save_file({k: v.contiguous() for k, v in best.items()}, str(path))


def log_best_model(plan: SearchPlan, parent_run_id: str, cfg: FinetuneConfig, weights: dict) -> tuple[str | None, str]:
    """The model of ``cfg`` with the trained tensors ``weights`` as the parent run's MLflow model; its URI and "", or
    None and why not when this machine cannot build it (e.g. a driver without the hub weights the trials' nodes had):
    the search's results stand, and the tensors on the parent run rebuild it where the weights are."""
    from vitplast_tune.errors import UserError
    from vitplast_tune.vit import best_model

    try:
        model = best_model.rebuild(cfg, weights)
    except (UserError, OSError, RuntimeError) as exc:
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        note = f"the best model is not logged as an MLflow model: it could not be built on this machine ({reason})"
        return None, note
    return best_model.log_model(model, cfg, plan.tracking_uri, parent_run_id), ""


def child_runs(mlflow: MlflowClient, parent_run_id: str) -> list:
    """Every child run of a parent run."""
    parent = mlflow.get_run(parent_run_id)
    return mlflow.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'", max_results=10_000
    )


def log_artifacts(mlflow: MlflowClient, run_id: str, paths: Iterable[Path], artifact_path: str | None = None) -> None:
    """Upload files to a run's artifacts."""
    for path in paths:
        mlflow.log_artifact(run_id, str(path), artifact_path)


def _error_text(trial) -> str:
    path = getattr(trial, "error_file", None)
    if path and Path(path).is_file():
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
        return lines[-1][:500] if lines else "error"
    return "error"


def _param_text(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text[:_MAX_PARAM]


def _number(value: Any, default: float) -> float:
    return float(value) if _is_number(value) else default


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _now_ms() -> int:
    return int(time.time() * 1000)
