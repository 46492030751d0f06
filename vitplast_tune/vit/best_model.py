"""The best model of a search, back as a timm model: rebuilt from the best trial's settings and its trained tensors
(``rebuild``), saved as an MLflow model where the trials ran for the driver to log on the search's parent run
(``prepare``, ``save_model``), and loaded in one line (``load_best_model``).

A trial saves only what it trains (its subset and the head); the rest of the model is what the run started from
(``vit.methods.plain_model``: the pretrained weights, the head and any untrained part seeded by the trial's seed, LoRA merged).
So the best trial's model is that start plus its trained tensors, read from safetensors: no pickle. The MLflow model
is pickled instead (MLflow's pytorch flavour), so that ``mlflow.pytorch.load_model`` gives the timm module back.
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
from vitplast_tune.typed import checked
from vitplast_tune.vit import methods, models
from vitplast_tune.vit.families.hf import HFClassifier


def rebuild(cfg: FinetuneConfig, trainable: dict[str, Tensor]) -> nn.Module:
    """Rebuild the model a run trained, with its trained tensors, in eval mode on the CPU.

    Args:
        cfg: The run's settings.
        trainable: The run's trained tensors by name (LoRA adapters are merged: ``vit.methods.plain_model``).

    Returns:
        The model.

    Raises:
        UserError: If the tensors do not fit the model.
    """
    return methods.plain_model(cfg, trainable)


def prepare(cfg: FinetuneConfig, checkpoint, target: str, staged: Sequence = ()) -> str:
    """The best trial's files, made where its trials ran (a Ray worker with a trial's resources) and written to
    ``target`` (a folder of the search's storage: a path or a URI): its best-validation trainable tensors
    (``WEIGHTS_FILE``) read from its Tune ``checkpoint``, and the model rebuilt with them as a saved MLflow model
    (``MODEL_NAME/``, see ``save_model``); return "" or, when the model cannot be built on that node (e.g. no hub
    weights there), why not: the tensors are written all the same. ``staged``: the driver's files the model reads
    (``data.staging``), used there in place of its paths."""
    from safetensors.torch import load_file

    from vitplast_tune.data import staging

    cfg = staging.localize(cfg, staged)
    with tempfile.TemporaryDirectory(prefix="vitplast-best-") as tmp:
        weights = Path(tmp) / WEIGHTS_FILE
        best_weights(checkpoint, weights)
        note = ""
        try:
            save_model(rebuild(cfg, load_file(str(weights))), cfg, Path(tmp) / MODEL_NAME)
        except (UserError, OSError, RuntimeError) as exc:
            reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            note = f"the best model is not logged as an MLflow model: it could not be built on its node ({reason})"
        upload(Path(tmp), target)
    return note


def best_weights(checkpoint, path: Path) -> None:
    """The best-validation trainable weights of a trial's checkpoint as the safetensors file ``path``, read through
    the checkpoint's own filesystem (the search's storage), only that file, not the optimizer state."""
    try:
        download(checkpoint.filesystem, f"{checkpoint.path}/{BEST_FILE}", path.parent).rename(path)
    except FileNotFoundError:  # a checkpoint written before best.safetensors: the best weights in state.pt
        _best_from_state(checkpoint, path)


def _best_from_state(checkpoint, path: Path) -> None:
    from safetensors.torch import save_file

    with checkpoint.as_directory() as source:
        # Memory-mapped: only the best weights are read, not the optimizer state and the last weights beside them.
        state = torch.load(Path(source) / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
        best = state.get("best", {}).get("trainable") or state["trainable"]
        save_file({k: v.contiguous() for k, v in best.items()}, str(path))


def save_model(model: nn.Module, cfg: FinetuneConfig, path: Path) -> Path:
    """Save ``model`` as an MLflow model in the folder ``path``, which the driver logs as ``best_model`` of the
    search's parent run (``records.best_trial``).

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
    """The best trial of a finished search as a timm model holding its best-validation weights, in eval mode.

    Found by the search's ``name`` through its record in ``storage``, or by an MLflow ``run_id`` alone (the search's
    parent run, or a trial's own run) on ``tracking_uri``, with no local record (a team's MLflow server); its settings
    and trained tensors (safetensors) are read from that run.

    Args:
        name: The search's name (``--name``).
        storage: Where its record lies (None: ``$VITPLAST_RESULTS_DIR``, else ``~/vitplast_tune_results``).
        tracking_uri: The MLflow store (None: the one the search used; with ``run_id``, ``$MLFLOW_TRACKING_URI``).
        device: Where the model is put.
        run_id: An MLflow run holding a best model: a search's parent run or a trial's run.

    Returns:
        The ``torch.nn.Module`` in eval mode on ``device``.

    Raises:
        UserError: If there is no such search or run, or it holds no best model (the message says why).
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
    return rebuild(FinetuneConfig.from_dict(about["settings"]), trainable).to(device)


def _best_files(run_id: str, uri: str, folders: Sequence[str], what: str) -> tuple[dict, dict[str, Tensor]]:
    """The best trial's row and settings (``TRIAL_FILE``) and trained tensors, from the first of ``folders`` that
    run ``run_id`` holds on ``uri``; UserError naming ``what`` when none does."""
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
