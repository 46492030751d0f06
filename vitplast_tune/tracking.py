"""MLflow records of a search, written from the driver: a parent run per search, a child per trial,
and what goes into each (params, tags, metrics, artifacts).

Logging from a Tune callback on the driver (not inside trials) works wherever trials run, with a
SQLite store on the head node or an ``mlflow server``. Runs are found again by tags, so a resumed
search continues its runs instead of duplicating them.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from ray.tune import Callback

from vitplast_tune import report, spaces
from vitplast_tune.plan import EXPERIMENT, SearchPlan
from vitplast_tune.trial import trial_config

SEARCH_TAG = "vitplast.search"
TRIAL_TAG = "ray.trial_id"
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
CURVE_METRICS = ("train_loss", "val_acc", "val_loss", "best_val_acc", "current_lr", "steps_per_s", "images_per_s")
_MAX_PARAM = 6000


def client(tracking_uri: str) -> MlflowClient:
    """An MLflow client for ``tracking_uri`` (e.g. ``sqlite:///path/mlflow.db`` or ``http://127.0.0.1:5000``)."""
    return MlflowClient(tracking_uri=tracking_uri)


def experiment_id(mlflow: MlflowClient, name: str) -> str:
    """Id of the experiment ``name``, created when missing."""
    experiment = mlflow.get_experiment_by_name(name)
    return experiment.experiment_id if experiment else mlflow.create_experiment(name)


def find_search_run(mlflow: MlflowClient, experiment: str, search: str) -> str | None:
    """Run id of the parent run of search ``search``, or None."""
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = mlflow.search_runs([exp.experiment_id], filter_string=f"tags.`{SEARCH_TAG}` = '{search}'", max_results=1)
    return runs[0].info.run_id if runs else None


def start_search_run(
    mlflow: MlflowClient, experiment: str, search: str, params: dict[str, Any], tags: dict[str, str]
) -> str:
    """Create the parent run of a search with its params and tags; return its id."""
    run = mlflow.create_run(experiment_id(mlflow, experiment), run_name=search, tags={SEARCH_TAG: search, **tags})
    log_params(mlflow, run.info.run_id, params)
    return run.info.run_id


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

    ``describe(config)`` returns the run name, params and start metrics of a trial (the search
    supplies it, e.g. the subset's plasticity scores), so this class knows nothing of training.
    """

    def __init__(
        self,
        tracking_uri: str,
        parent_run_id: str,
        describe: Callable[[dict[str, Any]], tuple[str, dict[str, Any], dict[str, float]]],
    ):
        self.tracking_uri = tracking_uri
        self.parent_run_id = parent_run_id
        self.describe = describe
        self.runs: dict[str, str] = {}
        self._mlflow: MlflowClient | None = None
        self._tagged_node: dict[str, tuple] = {}  # trial id -> (node ip, node id) last tagged

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
            name, params, metrics = self.describe(trial.config)
            tags = {PARENT_TAG: self.parent_run_id, TRIAL_TAG: trial.trial_id, RUN_NAME_TAG: f"{name} #{number or trial.trial_id}"}
            run_id = self.mlflow.create_run(parent.info.experiment_id, tags=tags).info.run_id
            log_params(self.mlflow, run_id, params)
            log_metrics(self.mlflow, run_id, metrics)
        self.runs[trial.trial_id] = run_id
        return run_id

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        self.run_id(trial, number=trials.index(trial) + 1 if trial in trials else None)

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        run_id = self.run_id(trial)
        step = int(result.get("step", result.get("training_iteration", 0)))
        log_metrics(self.mlflow, run_id, {k: result.get(k) for k in CURVE_METRICS}, step)
        node = (result.get("node_ip"), result.get("node_id"))
        if result.get("node_ip") and self._tagged_node.get(trial.trial_id) != node:  # again when a retry moved it
            tags = {"ray.node_ip": node[0], "ray.hostname": result.get("hostname"), "ray.node_id": node[1]}
            self.mlflow.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items() if v])
            self._tagged_node[trial.trial_id] = node

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        run_id = self.run_id(trial)
        last = trial.last_result or {}
        if last.get("diverged"):
            self.mlflow.set_tag(run_id, "failure_reason", str(last.get("error", "diverged")))
            self.mlflow.set_terminated(run_id, status="FAILED")
            return
        final = {"final_val_acc": last.get("val_acc"), "best_val_acc": last.get("best_val_acc"),
                 "test_acc": last.get("test_acc"), "final_step": last.get("step")}  # fmt: skip
        log_metrics(self.mlflow, run_id, final, int(last.get("step", 0)))
        self.mlflow.set_tag(run_id, "stopped_early", str(int(last.get("step", 0)) < int(last.get("max_steps", 0))))
        self.mlflow.set_terminated(run_id, status="FINISHED")

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        run_id = self.run_id(trial)
        reason = _error_text(trial)
        self.mlflow.set_tag(run_id, "failure_reason", reason)
        self.mlflow.set_terminated(run_id, status="FAILED")

    def get_state(self) -> dict:
        return {"runs": dict(self.runs)}

    def set_state(self, state: dict) -> None:
        self.runs.update(state.get("runs", {}))


def open_search_run(mlflow: MlflowClient, plan: SearchPlan, predictors: report.Predictors) -> str:
    """The parent run of a search: found again on ``--resume``, else created with the space, settings and plasticity."""
    if plan.options.resume:
        existing = find_search_run(mlflow, EXPERIMENT, plan.name)
        if existing:
            mlflow.update_run(existing, status="RUNNING")
            return existing
    spec = plan.spec
    params = {"space": spec.name, "algorithm": spec.algorithm, "scheduler": spec.scheduler.name, "num_samples": spec.num_samples,
              "metric": spec.metric, "mode": spec.mode, "search_seed": plan.options.seed, **plan.settings}  # fmt: skip
    tags = {"vitplast.space_fingerprint": spec.fingerprint, "vitplast.storage": f"{plan.storage}/{plan.name}"}
    plasticity = predictors.plasticity
    if plasticity is not None:
        meta = plasticity.meta
        params.update(plasticity_variant=meta["variant"], plasticity_reference=meta["reference"], plasticity_pairs=meta["n_pairs"])
    run_id = start_search_run(mlflow, EXPERIMENT, plan.name, params, tags)
    mlflow.log_text(run_id, spec.text, f"space/{spec.path.name}")
    if predictors.gradients is not None:
        mlflow.log_text(run_id, predictors.gradients.to_csv(index=False), "criteria/gradients.csv")
    if plasticity is not None:
        log_artifacts(mlflow, run_id, plasticity.files.values(), "plasticity")
        log_metrics(mlflow, run_id, {f"plasticity/{r.component}": r.plasticity for r in plasticity.ranking.itertuples()})
    return run_id


def trial_describer(plan: SearchPlan, predictors: report.Predictors):
    """The function that names a trial's child run and gives its params and predictor scores (see MlflowTracker)."""
    settings = plan.settings

    def describe(config: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, float]]:
        subset = spaces.config_components(config)
        cfg = trial_config(config, settings)
        params = {**cfg.to_dict(), "components": subset, **spaces.component_flags(subset)}
        name = f"{subset} lr={cfg.lr:.3g}" + (f" seed={cfg.seed}" if "seed" in config else "")
        return name, params, predictors.scores(subset)

    return describe


def log_results(mlflow: MlflowClient, run_id: str, trials_csv: Path, best: pd.DataFrame, num_trials: int) -> None:
    """The trial table and the headline metrics (best trial's accuracies, number of trials) on the parent run."""
    log_artifacts(mlflow, run_id, [trials_csv])
    if not best.empty:
        top = best.iloc[0]
        log_metrics(mlflow, run_id, {"best_val_acc": top["best_val_acc"], "best_test_acc": top.get("test_acc"), "num_trials": num_trials})


def log_analysis(mlflow: MlflowClient, run_id: str, found) -> None:
    """An ``analysis.SearchAnalysis`` on the parent run: its files, and ``corr/<target>/<predictor>/<statistic>``
    and ``paper/<statistic>`` metrics."""
    metrics: dict[str, Any] = {}
    if found.trials is not None:
        metrics["analysis/n_finished"] = found.trials.n_finished
        for row in found.trials.correlations.itertuples():
            for stat in ("n", "spearman", "spearman_low", "spearman_high", "kendall", "kendall_low", "kendall_high"):
                metrics[f"corr/{row.target}/{row.predictor}/{stat}"] = getattr(row, stat)
    if found.paper is not None:
        metrics.update({f"paper/{k}": found.paper.agreement[k] for k in ("spearman", "kendall")})
    log_metrics(mlflow, run_id, metrics)
    log_artifacts(mlflow, run_id, found.files, "analysis")


def log_pareto(mlflow: MlflowClient, run_id: str, files: Iterable[Path]) -> None:
    """The Pareto fronts (``results.write_pareto``: CSV and PNG per axis) on the parent run, under ``pareto/``."""
    log_artifacts(mlflow, run_id, files, "pareto")


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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _now_ms() -> int:
    return int(time.time() * 1000)
