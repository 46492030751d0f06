"""Bring a search's best model back as a timm model, and save it as an MLflow model where its trial ran.

A trial saves only what it trains. The rest is the model it started from, so the best model is that start plus the
trained tensors, read from safetensors.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import timm
import torch
from torch import Tensor, nn

from vitplast_tune import environment
from vitplast_tune._compat.mlflow import no_artifact_progress_bar
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import UserError
from vitplast_tune.log import quieted
from vitplast_tune.storage import (
    BEST_FILE,
    BEST_TRIAL_DIR,
    FAILURE_TAG,
    MODEL_NAME,
    STATE_FILE,
    TRIAL_FILE,
    WEIGHTS_DIR,
    WEIGHTS_FILE,
    download,
    read_record,
    search_dir,
    upload,
)
from vitplast_tune.type_checks import checked
from vitplast_tune.vit import methods, models
from vitplast_tune.vit.families.hf import HFClassifier


def prepare(cfg: FinetuneConfig, checkpoint, target: str, staged: Sequence = ()) -> str:
    """Write the best trial's tensors and MLflow model to ``target``, where the trials ran; return why no model, or "".

    The tensors are written even when the model cannot be built on that node. ``staged``: the driver's files it reads.
    """
    from safetensors.torch import load_file

    from vitplast_tune.data import staging

    cfg = staging.localize(cfg, staged)
    with tempfile.TemporaryDirectory(prefix="vitplast-best-") as tmp:
        weights = Path(tmp) / WEIGHTS_FILE
        best_weights(checkpoint, weights)
        note = ""
        try:
            save_model(methods.plain_model(cfg, load_file(str(weights))), cfg, Path(tmp) / MODEL_NAME)
        except (UserError, OSError, RuntimeError) as exc:
            reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            note = f"the best model is not logged as an MLflow model: it could not be built on its node ({reason})"
        upload(Path(tmp), target)
    return note


def best_weights(checkpoint, path: Path) -> None:
    """Save a trial checkpoint's best-validation trainable weights as the safetensors file ``path``."""
    try:
        download(checkpoint.filesystem, f"{checkpoint.path}/{BEST_FILE}", path.parent).rename(path)
    except FileNotFoundError:  # an older checkpoint keeps them in state.pt
        _best_from_state(checkpoint, path)


def _best_from_state(checkpoint, path: Path) -> None:
    from safetensors.torch import save_file

    with checkpoint.as_directory() as source:
        # Memory-mapped, so that only the best weights are read.
        state = torch.load(Path(source) / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
        best = state.get("best", {}).get("trainable") or state["trainable"]
        save_file({k: v.contiguous() for k, v in best.items()}, str(path))


def save_model(model: nn.Module, cfg: FinetuneConfig, path: Path) -> Path:
    """Save ``model`` in ``path`` as a pickled MLflow pytorch model, which the driver logs as ``best_model``.

    Pickled, since MLflow 3's default format loads back as a graph; requirements given, since inferring them reloads it.
    """
    import mlflow
    from mlflow.models import infer_signature

    data_config = models.data_config(model)
    example = np.random.default_rng(0).standard_normal((1, *data_config["input_size"])).astype(np.float32)
    with torch.no_grad():
        logits = model(torch.from_numpy(example)).numpy()
    requirements = [f"torch=={torch.__version__.split('+')[0]}", f"timm=={timm.__version__}"]
    if isinstance(model, HFClassifier):  # unpickling it needs transformers
        import transformers

        requirements.append(f"transformers=={transformers.__version__}")
    metadata = {"data_config": {k: list(v) if isinstance(v, tuple) else v for k, v in data_config.items()}}
    with quieted("mlflow.pytorch"):
        mlflow.pytorch.save_model(
            model,
            str(path),
            signature=infer_signature(example, logits),
            input_example=example,
            serialization_format="pickle",
            pip_requirements=requirements,
            metadata={**metadata, "settings": json.loads(json.dumps(cfg.to_dict(), default=str))},
        )
    return path


@checked()
def load_best_model(
    name: str | None = None,
    storage: str | Path | None = None,
    tracking_uri: str | None = None,
    device: str = "cpu",
    *,
    run_id: str | None = None,
) -> nn.Module:
    """Load the best model of a finished search, with its best-validation weights, in eval mode.

    Give the search's ``name``, or an MLflow ``run_id`` (its parent run or a trial's) to need no local record.

    Args:
        name: The search's name.
        storage: Where its record lies (None: ``$VITPLAST_RESULTS_DIR``, else ``~/vitplast_tune_results``).
        tracking_uri: The MLflow store (None: the search's; with ``run_id``, ``$MLFLOW_TRACKING_URI``).
        device: Where to put the model.
        run_id: An MLflow run that holds a best model.

    Returns:
        The model in eval mode on ``device``.

    Raises:
        UserError: There is no such search or run, or it holds no best model; the message says why.
    """
    if run_id is None:
        if name is None:
            raise UserError("load_best_model needs a search's name, or run_id= with tracking_uri=")
        record = read_record(search_dir(name, storage), purpose="recorded")
        uri, run_id, folders = tracking_uri or record["tracking_uri"], record["parent_run_id"], (BEST_TRIAL_DIR,)
        _check_finished(name, run_id, uri)
        what = f'search "{name}"'
    else:
        uri, folders = tracking_uri or environment.read("MLFLOW_TRACKING_URI", ""), (BEST_TRIAL_DIR, WEIGHTS_DIR)
        if not uri:
            raise UserError(
                "load_best_model(run_id=...) needs tracking_uri= (or $MLFLOW_TRACKING_URI): the run's store"
            )
        what = f"MLflow run {run_id}"
    about, trainable = _best_files(run_id, uri, folders, what)
    return methods.plain_model(FinetuneConfig.from_dict(about["settings"]), trainable).to(device)


def _best_files(run_id: str, uri: str, folders: Sequence[str], what: str) -> tuple[dict, dict[str, Tensor]]:
    """Download the best trial's row, settings and tensors from the first of ``folders`` the run holds."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from safetensors.torch import load_file

    problem = ""
    for artifacts in folders:
        with tempfile.TemporaryDirectory(prefix="vitplast-best-") as tmp, no_artifact_progress_bar():
            try:
                folder = mlflow.artifacts.download_artifacts(
                    run_id=run_id, artifact_path=artifacts, dst_path=tmp, tracking_uri=uri
                )
                return json.loads((Path(folder) / TRIAL_FILE).read_text()), load_file(str(Path(folder) / WEIGHTS_FILE))
            except (MlflowException, OSError) as exc:
                problem = str(exc).splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    raise UserError(
        f"{what} has no best model on its MLflow run {run_id} ({problem}): it has not finished, no trial succeeded, "
        "or the store moved (pass tracking_uri)"
    )


def _check_finished(name: str, run_id: str, tracking_uri: str) -> None:
    """Raise UserError, saying why, unless search ``name`` finished with a best trial."""
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
