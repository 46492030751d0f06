"""MLflow for a search, the generic part: the client, the experiment and where its artifacts go, the tags that tie
runs together, finding, closing and failing runs, and logging params, metrics and files in batches.

Logging from the driver (a Tune callback, not inside trials) works wherever trials run, with a SQLite store on the
head node or an ``mlflow server``. Runs are found again by tags, so a resumed search continues its runs instead of
duplicating them.
"""

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


# While trials run, an MLflow call to a server gets BOUNDED_RETRIES retries and BOUNDED_CALL_S seconds an attempt
# (MLflow's defaults: 7 retries, 120 s each, many minutes of silence from a stopped or stalled server). urllib3 waits
# 0, 2, 4, 8, 16, 32 s between them: a server restarted within about a minute is ridden out, one gone longer (or
# stalled: seven silent attempts) stops the search within about two (run.guard). A user's setting wins.
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
    """MLflow's calls to a tracking server bounded while in the block: ``retries`` retries, ``timeout_s`` seconds an
    attempt (a call that gets no answer fails within about (``retries`` + 1) x ``timeout_s`` + ``retries`` s). A
    variable the user set is kept."""
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
    """An MLflow client for ``tracking_uri`` (e.g. ``sqlite:///path/mlflow.db`` or ``http://127.0.0.1:5000``); a
    SQLite store is opened (made, or its schema upgraded, by MLflow) under ``store_lock``."""
    with store_lock(tracking_uri):
        return MlflowClient(tracking_uri=tracking_uri)


@contextlib.contextmanager
def store_lock(tracking_uri: str) -> Iterator[None]:
    """For a SQLite store: an exclusive lock on a file beside it (``<its file>.lock``) while in the block, so that
    processes opening one new store at once make (or upgrade) its schema one after the other (MLflow's migrations
    race otherwise: "table ... already exists"); nothing for other stores.

    Args:
        tracking_uri: the tracking URI (``sqlite:///path/mlflow.db`` takes the lock).
    """
    path = sqlite_file(tracking_uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.name}.lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
        yield


def sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a SQLite tracking URI (``sqlite:///path/mlflow.db``, ``~`` expanded); None for other
    stores and an in-memory database."""
    database = tracking_uri.split(":///", 1)[1].split("?")[0] if tracking_uri.startswith("sqlite:///") else ""
    return Path(database).expanduser() if database and database != ":memory:" else None


def experiment_id(mlflow: MlflowClient, name: str, artifact_location: str | None = None) -> str:
    """Id of the experiment ``name``, created when missing as a model-training experiment (``view.KIND_TAG``; its
    artifacts at ``artifact_location``: see ``artifact_location``; an existing experiment keeps its location and
    kind)."""
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
    """Where a new experiment keeps its artifacts, never the working directory (MLflow's default ``./mlruns``): beside
    a SQLite store (``<its folder>/mlartifacts/<experiment>``); the server's choice for http(s) and Databricks (None);
    the file store's own folder for ``file:`` (None); under the search storage for other databases."""
    scheme = urlsplit(tracking_uri).scheme.lower()
    folder = _folder_name(experiment)
    if (database := sqlite_file(tracking_uri)) is not None:
        return str(database.resolve().parent / ARTIFACTS_DIR / folder)
    if scheme in ("http", "https", "databricks", "file", ""):
        return None
    root = storage if is_uri(storage) else str(Path(storage).expanduser().resolve())
    return f"{root.rstrip('/')}/{ARTIFACTS_DIR}/{folder}"


def _folder_name(experiment: str) -> str:
    """A folder name for an experiment: its name when that is safe, else a safe form (200 characters at most) with a
    hash of the name (never digits alone, which an ``mlflow server``'s own experiment folders use)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", experiment).strip("-.") or "experiment"
    if safe != experiment or safe.isdigit() or len(safe) > 200:  # a file system takes names of 255 bytes at most
        safe = f"{safe[:200]}-{hashlib.sha256(experiment.encode()).hexdigest()[:8]}"
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


def log_params(mlflow: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    """Log params (values as strings, None skipped) in one batch."""
    batch = [Param(k, _param_text(v)) for k, v in params.items() if v is not None]
    for i in range(0, len(batch), 100):
        mlflow.log_batch(run_id, params=batch[i : i + 100])


def log_metrics(
    mlflow: MlflowClient, run_id: str, metrics: dict[str, Any], step: int = 0, timestamp_ms: int | None = None
) -> None:
    """Log the finite numeric values of ``metrics`` at ``step`` in one batch (at ``timestamp_ms``, default now: a
    metric logged again with the same step, value and time is stored once by MLflow's database stores)."""
    now = _now_ms() if timestamp_ms is None else timestamp_ms
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if is_number(v)]
    if batch:
        mlflow.log_batch(run_id, metrics=batch)


def log_inputs(mlflow: MlflowClient, run_id: str, inputs: list) -> None:
    """Log dataset inputs to a run; a dataset another search logged to the experiment at the same moment is taken as
    logged (MLflow's insert of it fails on its key, and the write is made again, which finds it and links the run).

    Args:
        mlflow: The client.
        run_id: The run.
        inputs: MLflow ``DatasetInput`` entities.

    Raises:
        MlflowException: On any other failure, or when the write fails twice.
    """
    try:
        mlflow.log_inputs(run_id, datasets=inputs)
    except MlflowException as exc:
        if not mlflow_internals.written_first_by_another(exc):
            raise
        mlflow.log_inputs(run_id, datasets=inputs)  # MLflow's store rolled the first back: nothing is half-written


def trial_runs(mlflow: MlflowClient, parent_run_id: str) -> dict[str, str]:
    """The child run id of each trial id of a search."""
    runs = child_runs(mlflow, parent_run_id)
    return {run.data.tags[TRIAL_TAG]: run.info.run_id for run in runs if TRIAL_TAG in run.data.tags}


def child_runs(mlflow: MlflowClient, parent_run_id: str) -> list:
    """Every child run of a parent run (page after page)."""
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
    """When a run started (ms since the epoch): the time of the values a search logs once at its end, so that a
    resumed end logs the same ones again (stored once, see ``log_metrics``)."""
    return int(mlflow.get_run(run_id).info.start_time)


def log_table_once(mlflow: MlflowClient, run_id: str, table, path: str) -> None:
    """``MlflowClient.log_table`` unless the run already holds ``path`` (log_table appends to a table it finds)."""
    folder = path.rsplit("/", 1)[0] if "/" in path else None
    if any(a.path == path for a in mlflow.list_artifacts(run_id, folder)):
        return
    mlflow.log_table(run_id, table, path)


def log_artifacts(mlflow: MlflowClient, run_id: str, paths: Iterable[Path], artifact_path: str | None = None) -> None:
    """Upload files to a run's artifacts."""
    for path in paths:
        mlflow.log_artifact(run_id, str(path), artifact_path)


def param_texts(params: dict[str, Any]) -> dict[str, str]:
    """``params`` as MLflow stores them (``log_params``): values as strings, None left out."""
    return {k: _param_text(v) for k, v in params.items() if v is not None}


def _param_text(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text[:_MAX_PARAM]


def number_or(value: Any, default: float) -> float:
    """``value`` as a float when it is a finite number, else ``default``."""
    return float(value) if is_number(value) else default


def is_number(value: Any) -> bool:
    """Whether ``value`` is a finite real number (not a bool): what MLflow takes as a metric."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _now_ms() -> int:
    return int(time.time() * 1000)
