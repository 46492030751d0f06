"""The best trial of a finished search on MLflow: its best-validation weights and settings on the parent run and its
own run, and the model rebuilt with them as the parent's MLflow model."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from vitplast_tune import storage
from vitplast_tune.config import FinetuneConfig, trial_config
from vitplast_tune.records.tracking import BEST_RUN_TAG, BEST_TAG, log_artifacts
from vitplast_tune.storage import BEST_FILE, BEST_TRIAL_DIR, STATE_FILE, TRIAL_FILE, WEIGHTS_DIR, WEIGHTS_FILE


def log_best_trial(
    mlflow: MlflowClient, settings: FinetuneConfig, tracking_uri: str, parent_run_id: str, result, row: dict[str, Any]
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

    cfg = trial_config(result.config or {}, settings)
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
    return log_best_model(tracking_uri, parent_run_id, cfg, weights)


def best_weights(checkpoint, path: Path) -> None:
    """The best-validation trainable weights of a trial's checkpoint as the safetensors file ``path``."""
    try:
        storage.download(checkpoint.filesystem, f"{checkpoint.path}/{BEST_FILE}", path.parent).rename(path)
    except FileNotFoundError:  # a checkpoint written before best.safetensors: the best weights in state.pt
        _best_from_state(checkpoint, path)


def _best_from_state(checkpoint, path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    with checkpoint.as_directory() as source:
        # Memory-mapped: only the best weights are read, not the optimizer state and the last weights beside them.
        state = torch.load(Path(source) / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
        best = state.get("best", {}).get("trainable") or state["trainable"]
        save_file({k: v.contiguous() for k, v in best.items()}, str(path))


def log_best_model(tracking_uri: str, parent_run_id: str, cfg: FinetuneConfig, weights: dict) -> tuple[str | None, str]:
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
    return best_model.log_model(model, cfg, tracking_uri, parent_run_id), ""
