"""The best model of a search, back as a timm model: rebuilt from the best trial's settings and its trained tensors
(``rebuild``), logged as an MLflow model on the search's parent run (``log_model``), and loaded in one line
(``load_best_model``).

A trial saves only what it trains (its subset and the head); the rest of the model is what the run started from
(``vit.methods.plain_model``: the pretrained weights, the head and any untrained part seeded by the trial's seed, LoRA merged).
So the best trial's model is that start plus its trained tensors, read from safetensors: no pickle. The MLflow model
is pickled instead (MLflow's pytorch flavour), so that ``mlflow.pytorch.load_model`` gives the timm module back.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import timm
import torch
from torch import Tensor, nn

from vitplast_tune._compat.mlflow import no_artifact_progress_bar
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import UserError
from vitplast_tune.storage import (
    BEST_TRIAL_DIR,
    FAILURE_TAG,
    MODEL_NAME,
    TRIAL_FILE,
    WEIGHTS_FILE,
    read_record,
    search_dir,
)
from vitplast_tune.vit import methods, models
from vitplast_tune.vit.families.hf import HFClassifier

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"


def rebuild(cfg: FinetuneConfig, trainable: dict[str, Tensor]) -> nn.Module:
    """The model a run of ``cfg`` trained, with its trained tensors ``trainable`` (name -> tensor; LoRA adapters
    merged, ``vit.methods.plain_model``), in eval mode on the CPU; UserError when the tensors do not fit the model."""
    return methods.plain_model(cfg, trainable)


def log_model(model: nn.Module, cfg: FinetuneConfig, tracking_uri: str, run_id: str) -> str:
    """Log ``model`` as the MLflow model ``best_model`` of run ``run_id``; return its URI ``runs:/<run_id>/best_model``.

    The pytorch flavour, pickled (MLflow 3's default, pt2, loads back as an inference-only graph, not the timm
    module); its signature is a float32 batch of the model's input size (the model's own normalisation applied, see
    the metadata's ``data_config``) to its logits, with one such image as the input example. The requirements are
    given (torch, timm) rather than inferred, which would load the model once more in a child process.
    """
    import mlflow
    from mlflow.models import infer_signature

    data_config = models.data_config(model)
    example = np.random.default_rng(0).standard_normal((1, *data_config["input_size"])).astype(np.float32)
    with torch.no_grad():
        logits = model(torch.from_numpy(example)).numpy()
    requirements = [f"torch=={torch.__version__.split('+')[0]}", f"timm=={timm.__version__}"]
    if isinstance(model, HFClassifier):  # a transformers model inside: unpickling it needs transformers
        import transformers

        requirements.append(f"transformers=={transformers.__version__}")
    metadata = {"data_config": {k: list(v) if isinstance(v, tuple) else v for k, v in data_config.items()}}
    with _active_run(tracking_uri, run_id), _quiet("mlflow.pytorch"):
        mlflow.pytorch.log_model(
            model,
            name=MODEL_NAME,
            signature=infer_signature(example, logits),
            input_example=example,
            serialization_format="pickle",
            pip_requirements=requirements,
            metadata={**metadata, "settings": json.loads(json.dumps(cfg.to_dict(), default=str))},
        )
    return f"runs:/{run_id}/{MODEL_NAME}"


def load_best_model(
    name: str, storage: str | Path | None = None, tracking_uri: str | None = None, device: str = "cpu"
) -> nn.Module:
    """The best trial of the finished search ``name`` as a timm model holding its best-validation weights, in eval
    mode on ``device``: found through the search's record in ``storage`` (default ``~/vitplast_tune_results``), its
    settings and trained tensors (safetensors) read from the search's MLflow parent run (``tracking_uri``: default
    the one the search used)."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from safetensors.torch import load_file

    record = read_record(search_dir(name, storage), purpose="recorded")
    uri = tracking_uri or record["tracking_uri"]
    _check_finished(name, record["parent_run_id"], uri)
    with tempfile.TemporaryDirectory(prefix="vitplast-best-") as tmp, no_artifact_progress_bar():
        try:
            folder = mlflow.artifacts.download_artifacts(
                run_id=record["parent_run_id"], artifact_path=BEST_TRIAL_DIR, dst_path=tmp, tracking_uri=uri
            )
            about = json.loads((Path(folder) / TRIAL_FILE).read_text())
            trainable = load_file(str(Path(folder) / WEIGHTS_FILE))
        except (MlflowException, OSError) as exc:
            raise UserError(
                f'search "{name}" has no best model on its MLflow run {record["parent_run_id"]} '
                f"({str(exc).splitlines()[0][:200]}): it has not finished, no trial succeeded, or the store moved "
                "(pass tracking_uri)"
            ) from None
    return rebuild(FinetuneConfig.from_dict(about["settings"]), trainable).to(device)


def _check_finished(name: str, run_id: str, tracking_uri: str) -> None:
    """UserError, saying why, unless the parent run ``run_id`` of search ``name`` finished with a best trial."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    try:
        run = client.get_run(run_id)
        best = client.list_artifacts(run_id, BEST_TRIAL_DIR) if run.info.status == "FINISHED" else []
    except MlflowException as exc:
        raise UserError(
            f'search "{name}": its MLflow run {run_id} is not in {tracking_uri} ({str(exc).splitlines()[0][:120]}); '
            "pass the store it moved to (tracking_uri)"
        ) from None
    why = {
        "KILLED": "was interrupted before its trials ended (its MLflow run is KILLED): continue it with --resume",
        "RUNNING": "has not finished (its MLflow run is RUNNING: still running, or its driver was killed; --resume "
        "continues it)",
        "FAILED": f"failed ({run.data.tags.get(FAILURE_TAG, 'no reason recorded')})",
        "FINISHED": "finished with no trial that trained a model (every trial failed, or none fit the budget)",
    }
    if run.info.status != "FINISHED" or not best:
        raise UserError(f'search "{name}" has no best model: it {why.get(run.info.status, run.info.status)}')


@contextmanager
def _active_run(tracking_uri: str, run_id: str) -> Iterator[None]:
    """The run ``run_id`` of ``tracking_uri`` as MLflow's active run (what its ``log_model`` logs to); nested, so that
    a run the caller has active stays as it was. The process's tracking URI is put back afterwards, and
    ``$MLFLOW_TRACKING_URI`` too (``mlflow.set_tracking_uri`` writes it)."""
    import mlflow

    env = os.environ.get(TRACKING_URI_ENV)
    previous = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(tracking_uri)
    try:
        with mlflow.start_run(run_id=run_id, nested=True):
            yield
    finally:
        mlflow.set_tracking_uri(None if previous == env else previous)
        if env is None:
            os.environ.pop(TRACKING_URI_ENV, None)
        else:
            os.environ[TRACKING_URI_ENV] = env


@contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Only errors from ``logger``: MLflow warns that a pickled model runs code when loaded, which is this choice
    (``load_best_model`` reads safetensors instead)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
