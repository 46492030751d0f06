"""MLflow for a search: the client, the experiment, the tags that tie runs together, and logging in batches."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import numbers
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.tracking.context.registry import resolve_tags

from vitplast_tune import environment, storage
from vitplast_tune._compat import mlflow as mlflow_internals
from vitplast_tune.records import view
from vitplast_tune.storage import BEST_TRIAL_DIR, WEIGHTS_FILE, is_uri

SEARCH_TAG = view.SEARCH_TAG
ROLE_TAG = view.ROLE_TAG  # "search" on the parent run, "trial" on each child: filter by it
SEARCH_ID_TAG = "vitplast.search_id"  # unique per search: a shared server may hold several searches of one name
STORAGE_TAG = "vitplast.storage"
DEVICE_TAG = "vitplast.device"  # where a trial trained: "cpu" or "cuda:0 <the GPU's name>"
PRECISION_TAG = "vitplast.precision"  # what it computed in: fp32, bf16 or fp16
WORKERS_TAG = "vitplast.workers"  # how many data-parallel workers trained it (run/parallel.py)
WORKER_NODES_TAG = "vitplast.worker_nodes"  # the Ray node ids of its workers, rank 0 first, comma-separated
FAILURE_TAG = storage.FAILURE_TAG
TRIAL_TAG = "ray.trial_id"
STAGE_TAG = "vitplast.stage"  # on each trial's run: "search", "baseline" (a reference trial) or "finalist"
SEED_TAG = "vitplast.seed"  # on each trial's run: its training seed
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
NOTE_TAG = "mlflow.note.content"  # the run's description in the UI (Markdown)
VIEW_LINK_TAG = "vitplast.view_link"
STUDY_TAG = "vitplast.optuna_study"  # the search's Optuna study: its storage URL and name (records/study.py)
BEST_TAG = "vitplast.best"  # "true" on the best trial's run
BEST_RUN_TAG = "vitplast.best_run_id"  # on the parent run: the best trial's run
ELAPSED_METRIC = "elapsed_s"  # on the parent run: the driver's wall time at its end, as its summary and status say it
CURVE_METRICS = (
    *("train_loss", "val_acc", "val_loss", "best_val_acc", "current_lr", "steps_per_s", "images_per_s"),
    *("time_in_steps_s", "val_acc_per_gpu_hour"),  # the trial's training seconds so far, and accuracy per GPU-hour
)
# Logged once per trial after the search, from the trial table (records.table.trial_table).
FINAL_METRICS = ("val_acc_common", "common_step", "trainable_params", "log10_trainable_params", "best_val_loss")
BEST_WEIGHTS = f"{BEST_TRIAL_DIR}/{WEIGHTS_FILE}"
ARTIFACTS_DIR = "mlartifacts"  # beside a SQLite store: one folder per experiment
_MAX_PARAM = 6000


# While trials run, an MLflow call to a server gets BOUNDED_RETRIES retries of BOUNDED_CALL_S seconds each, not
# MLflow's minutes. A server back within a minute is ridden out; one gone longer stops the search (run.guard).
BOUNDED_CALL_S = 8
BOUNDED_RETRIES = 6
BOUNDED_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(BOUNDED_RETRIES),
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": str(BOUNDED_CALL_S),
}


@contextlib.contextmanager
def bounded_calls(retries: int = BOUNDED_RETRIES, timeout_s: int = BOUNDED_CALL_S) -> Iterator[None]:
    """Bound MLflow's calls to a server in the block to ``retries`` of ``timeout_s`` s; a user's setting wins."""
    bounds = {
        **BOUNDED_ENV,
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries),
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_s),
    }
    wanted = {key: value for key, value in bounds.items() if not environment.is_set(key)}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key in wanted:
            os.environ.pop(key, None)


def client(tracking_uri: str) -> MlflowClient:
    """Make an MLflow client for ``tracking_uri``, opening a SQLite store under ``store_lock``."""
    with store_lock(tracking_uri):
        return MlflowClient(tracking_uri=tracking_uri)


@contextlib.contextmanager
def store_lock(tracking_uri: str) -> Iterator[None]:
    """Hold a lock beside a SQLite store in the block, so that MLflow's migrations of it never race."""
    path = sqlite_file(tracking_uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.name}.lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
        yield


def sqlite_file(tracking_uri: str) -> Path | None:
    """Return the file of a SQLite tracking URI; None for other stores and an in-memory database."""
    database = tracking_uri.split(":///", 1)[1].split("?")[0] if tracking_uri.startswith("sqlite:///") else ""
    return Path(database).expanduser() if database and database != ":memory:" else None


def experiment_id(mlflow: MlflowClient, name: str, artifact_location: str | None = None) -> str:
    """Return the id of the experiment ``name``, made when missing as a model-training experiment."""
    experiment = mlflow.get_experiment_by_name(name)
    if experiment:
        return experiment.experiment_id
    try:
        return mlflow.create_experiment(name, artifact_location=artifact_location, tags={view.KIND_TAG: view.KIND})
    except MlflowException as exc:  # another driver made it since (two searches starting at once on one server)
        if exc.error_code != "RESOURCE_ALREADY_EXISTS" or (experiment := mlflow.get_experiment_by_name(name)) is None:
            raise
        return experiment.experiment_id


def artifact_location(tracking_uri: str, experiment: str, storage: str) -> str | None:
    """Choose where a new experiment keeps its artifacts: beside a SQLite store, under the storage for another
    database, and None where a server or file store chooses."""
    scheme = urlsplit(tracking_uri).scheme.lower()
    folder = _folder_name(experiment)
    if (database := sqlite_file(tracking_uri)) is not None:
        return str(database.resolve().parent / ARTIFACTS_DIR / folder)
    if scheme in ("http", "https", "databricks", "file", ""):
        return None
    root = storage if is_uri(storage) else str(Path(storage).expanduser().resolve())
    return f"{root.rstrip('/')}/{ARTIFACTS_DIR}/{folder}"


def _folder_name(experiment: str) -> str:
    """Name an experiment's folder: its name when that is safe, else a safe form with a hash of the name."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", experiment).strip("-.") or "experiment"
    if safe != experiment or safe.isdigit() or len(safe) > 200:  # a file system takes names of 255 bytes at most
        safe = f"{safe[:200]}-{hashlib.sha256(experiment.encode()).hexdigest()[:8]}"
    return safe


def find_search_run(
    mlflow: MlflowClient, experiment: str, search: str, search_id: str | None = None, storage: str | None = None
) -> str | None:
    """Find the parent run of search ``search``, narrowed by its id or storage when given; None when not one."""
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
    """Create a search's parent run with its params and tags, and return its id."""
    tags = {**source_tags(), SEARCH_TAG: search, ROLE_TAG: "search", **tags}
    run = mlflow.create_run(experiment_id(mlflow, experiment, artifacts), run_name=search, tags=tags)
    log_params(mlflow, run.info.run_id, params)
    return run.info.run_id


def source_tags() -> dict[str, str]:
    """Return MLflow's source tags for runs made through the client: entry point, git commit and user."""
    name = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-", "-c") else "vitplast_tune"
    tags = resolve_tags({"mlflow.source.name": name})
    return {k: str(v) for k, v in tags.items() if k.startswith(("mlflow.source.", "mlflow.user"))}


def log_params(mlflow: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    """Log params as text, None skipped, in batches."""
    batch = [Param(k, v) for k, v in param_texts(params).items()]
    for i in range(0, len(batch), 100):
        mlflow.log_batch(run_id, params=batch[i : i + 100])


def log_metrics(
    mlflow: MlflowClient, run_id: str, metrics: dict[str, Any], step: int = 0, timestamp_ms: int | None = None
) -> None:
    """Log the finite numbers of ``metrics`` at ``step`` and ``timestamp_ms`` (default now) in one batch."""
    now = _now_ms() if timestamp_ms is None else timestamp_ms
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if is_number(v)]
    if batch:
        mlflow.log_batch(run_id, metrics=batch)


def log_inputs(mlflow: MlflowClient, run_id: str, inputs: list) -> None:
    """Log dataset inputs to a run, writing again once where another search logged the same dataset at once."""
    try:
        mlflow.log_inputs(run_id, datasets=inputs)
    except MlflowException as exc:
        if not mlflow_internals.written_first_by_another(exc):
            raise
        mlflow.log_inputs(run_id, datasets=inputs)  # MLflow's store rolled the first back: nothing is half-written


def trial_runs(mlflow: MlflowClient, parent_run_id: str) -> dict[str, str]:
    """Map each trial id of a search to its child run id."""
    runs = child_runs(mlflow, parent_run_id)
    return {run.data.tags[TRIAL_TAG]: run.info.run_id for run in runs if TRIAL_TAG in run.data.tags}


def child_runs(mlflow: MlflowClient, parent_run_id: str) -> list:
    """List every child run of a parent run."""
    parent = mlflow.get_run(parent_run_id)
    found, token = [], None
    while True:
        page = mlflow.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
            max_results=10_000,
            page_token=token,
        )
        found += list(page)
        token = page.token
        if not token:
            return found


def start_ms(mlflow: MlflowClient, run_id: str) -> int:
    """Return when a run started, in ms: the time of the values logged at a search's end, the same on a resume."""
    return int(mlflow.get_run(run_id).info.start_time)


def log_table_once(mlflow: MlflowClient, run_id: str, table, path: str) -> None:
    """Log a table unless the run already holds ``path``; ``log_table`` would append to it."""
    folder = path.rsplit("/", 1)[0] if "/" in path else None
    if any(a.path == path for a in mlflow.list_artifacts(run_id, folder)):
        return
    mlflow.log_table(run_id, table, path)


def log_artifacts(mlflow: MlflowClient, run_id: str, paths: Iterable[Path], artifact_path: str | None = None) -> None:
    """Upload files to a run's artifacts."""
    for path in paths:
        mlflow.log_artifact(run_id, str(path), artifact_path)


def param_texts(params: dict[str, Any]) -> dict[str, str]:
    """Turn params into the text MLflow stores, None left out."""
    return {k: _param_text(v) for k, v in params.items() if v is not None}


def _param_text(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text[:_MAX_PARAM]


def number_or(value: Any, default: float) -> float:
    """Return ``value`` as a float when it is a finite number, else ``default``."""
    return float(value) if is_number(value) else default


def is_number(value: Any) -> bool:
    """Tell whether ``value`` is a finite real number, not a bool: what MLflow takes as a metric."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _now_ms() -> int:
    return int(time.time() * 1000)
