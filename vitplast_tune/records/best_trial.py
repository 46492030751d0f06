"""Log a finished search's best trial on MLflow: its weights, its settings and its model rebuilt where trials ran."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from mlflow.entities import LoggedModelStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from vitplast_tune import environment
from vitplast_tune.config import FinetuneConfig, trial_config
from vitplast_tune.records.tracking import BEST_RUN_TAG, BEST_TAG, log_artifacts
from vitplast_tune.storage import (
    BEST_TRIAL_DIR,
    MODEL_NAME,
    TRIAL_FILE,
    WEIGHTS_DIR,
    WEIGHTS_FILE,
    SearchPlace,
    fetch,
    is_uri,
    join,
    remove,
)

CHUNK_BYTES = 64 * 2**20  # how much of the best model's files a worker sends the driver at a time
STAGING_DIR = ".best_model"  # in Tune's folder of the search; removed once the model is logged
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
# The MLmodel fields that describe the model; Model.log writes the others.
MODEL_FIELDS = ("flavors", "signature", "saved_input_example_info", "mlflow_version", "model_size_bytes", "metadata")


def log_best_trial(
    mlflow: MlflowClient,
    settings: FinetuneConfig,
    place: SearchPlace,
    parent_run_id: str,
    result,
    row: dict[str, Any],
    runner: Callable[..., Any],
    staged: Sequence = (),
) -> tuple[str | None, str]:
    """Log the best trial's weights and settings on the parent run and its own run, and its model on the parent.

    ``runner(fn, **kwargs)`` runs the model's build where the trials ran. Nothing is done again once the model is
    logged. Returns the model's URI (None when it was not built) and a note saying why not.
    """
    if (uri := logged_model(mlflow, parent_run_id)) is not None:
        return uri, ""
    cfg = trial_config(result.config or {}, settings)
    run_id = row.get("run_id") if isinstance(row.get("run_id"), str) else None
    target = join(place.location, STAGING_DIR)
    note, sizes, made = runner(_prepare, cfg=cfg, checkpoint=result.checkpoint, target=target, staged=list(staged))
    with tempfile.TemporaryDirectory(prefix="vitplast-best-") as directory:
        folder = Path(directory)
        if made is None:
            fetch(target, folder)
        else:  # an object store's files come from the worker's folder, a chunk at a time (see _prepare)
            fetch_from_worker(runner, made, sizes, folder)
        (folder / TRIAL_FILE).write_text(json.dumps({**row, "settings": cfg.to_dict()}, indent=2, default=str))
        files = [folder / WEIGHTS_FILE, folder / TRIAL_FILE]
        log_artifacts(mlflow, parent_run_id, files, BEST_TRIAL_DIR)
        if run_id:
            log_artifacts(mlflow, run_id, files, WEIGHTS_DIR)
            mlflow.set_tag(run_id, BEST_TAG, "true")
            mlflow.set_tag(parent_run_id, BEST_RUN_TAG, run_id)
        model = folder / MODEL_NAME
        uri = None
        if (model / "MLmodel").is_file():
            try:
                uri = log_prepared_model(place.tracking_uri, parent_run_id, model)
            except (MlflowException, OSError, ValueError, yaml.YAMLError) as exc:  # the weights are logged already
                reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
                note = f"the best model is not logged as an MLflow model: its files did not log ({reason})"
    if made is None:
        remove(target)
    return uri, note


def fetch_from_worker(
    runner: Callable[..., Any], made: str, sizes: dict[str, int], folder: Path, chunk_bytes: int = CHUNK_BYTES
) -> None:
    """Copy the files a worker made in its folder ``made`` into ``folder``, a chunk per call, then remove them."""
    try:
        for name, size in sizes.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as out:
                for offset in range(0, size, chunk_bytes):
                    out.write(runner(_read_chunk, path=os.path.join(made, name), offset=offset, size=chunk_bytes))
    finally:
        runner(shutil.rmtree, path=made, ignore_errors=True)


def _prepare(**kwargs: Any) -> tuple[str, dict[str, int], str | None]:
    """Build the best model in a Ray worker; for an object store, keep its files there and return their sizes."""
    from vitplast_tune.vit.best_model import prepare

    if not is_uri(kwargs["target"]):
        return prepare(**kwargs), {}, None
    made = tempfile.mkdtemp(prefix="vitplast-best-")
    note = prepare(**{**kwargs, "target": made})
    sizes = {p.relative_to(made).as_posix(): p.stat().st_size for p in Path(made).rglob("*") if p.is_file()}
    return note, sizes, made


def _read_chunk(path: str, offset: int, size: int) -> bytes:
    """Read at most ``size`` bytes of the file ``path`` from ``offset``, on the worker's node."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def logged_model(mlflow: MlflowClient, run_id: str) -> str | None:
    """Return ``runs:/<run_id>/best_model`` when the run holds that model whole (READY), else None."""
    outputs = mlflow.get_run(run_id).outputs
    for output in outputs.model_outputs if outputs is not None else []:
        model = mlflow.get_logged_model(output.model_id)
        if model.name == MODEL_NAME and model.status == LoggedModelStatus.READY:
            return f"runs:/{run_id}/{MODEL_NAME}"
    return None


class _Saved:
    """A flavour for ``mlflow.models.Model.log`` whose model is already saved in ``folder``."""

    def __init__(self, folder: Path):
        self.folder = folder

    def save_model(self, path: str, mlflow_model, **kwargs: Any) -> None:
        from mlflow.models import Model

        shutil.copytree(self.folder, path, dirs_exist_ok=True)
        saved = Model.load(os.path.join(path, "MLmodel"))
        for field in MODEL_FIELDS:
            setattr(mlflow_model, field, getattr(saved, field))
        mlflow_model.save(os.path.join(path, "MLmodel"))


def log_prepared_model(tracking_uri: str, run_id: str, folder: Path) -> str:
    """Log the MLflow model saved in ``folder`` as ``best_model`` of run ``run_id``, without loading it."""
    from mlflow.models import Model

    mlflow = MlflowClient(tracking_uri)
    experiment = mlflow.get_run(run_id).info.experiment_id
    made = mlflow.create_logged_model(experiment, name=MODEL_NAME, source_run_id=run_id)
    with _tracking(tracking_uri):
        Model.log(
            artifact_path=None,
            flavor=_Saved(folder),
            name=MODEL_NAME,
            run_id=run_id,
            model_id=made.model_id,
            flavor_name="pytorch",
            serialization_format="pickle",
            validate_serving_input=False,
        )
    return f"runs:/{run_id}/{MODEL_NAME}"


@contextlib.contextmanager
def _tracking(tracking_uri: str) -> Iterator[None]:
    """Set MLflow's tracking URI in the block, then put back the process's own and ``$MLFLOW_TRACKING_URI``."""
    import mlflow

    env = environment.read(TRACKING_URI_ENV)
    previous = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None if previous == env else previous)
        if env is None:
            os.environ.pop(TRACKING_URI_ENV, None)
        else:
            os.environ[TRACKING_URI_ENV] = env
