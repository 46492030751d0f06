"""Write and read a trial's checkpoints, and report a run whose loss diverged."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.space.objectives import METRICS
from vitplast_tune.storage import BEST_FILE, STATE_FILE


def diverged(exc: Exception, cfg: FinetuneConfig) -> dict[str, Any]:
    """Make the report of a run whose loss diverged: NaN metrics, the reason and the step."""
    nan = {metric: float("nan") for metric in METRICS}
    return {**nan, "diverged": 1, "error": str(exc), "step": exc.step, "max_steps": cfg.max_steps}


@contextlib.contextmanager
def _checkpoint_directory(state: dict[str, Any]) -> Iterator[str]:
    """Write the checkpoint of ``state`` into a temporary folder, removed after the block."""
    with tempfile.TemporaryDirectory() as directory:
        write_checkpoint(Path(directory), state)
        yield directory


def checkpoint_due(metrics: dict[str, Any], eval_every: int, every: int) -> bool:
    """Tell whether a report carries a checkpoint: every ``every``-th evaluation, a new best, the last step."""
    step = int(metrics["step"])
    evaluation = -(-step // eval_every)  # the last evaluation may come before a whole eval_every
    return evaluation % every == 0 or metrics.get("best_step") == step or step >= int(metrics["max_steps"])


def write_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    """Write a run's state as ``state.pt`` and its best weights as ``best.safetensors`` in ``directory``."""
    import torch
    from safetensors.torch import save_file

    best = state["best"]
    kept = ("step", "trainable", "optimizer", "ema", "timing")
    torch.save({k: state[k] for k in kept if k in state}, directory / STATE_FILE)
    tensors = best["trainable"] if best["trainable"] is not None else state["trainable"]
    about = {"step": str(best["step"]), "val_acc": repr(float(best["val_acc"]))}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / BEST_FILE), metadata=about)


def read_checkpoint(checkpoint) -> dict[str, Any] | None:
    """Read the state a Tune checkpoint holds through its filesystem, or None."""
    if checkpoint is None:
        return None
    import torch
    from safetensors import safe_open

    with checkpoint.as_directory() as directory:
        state = torch.load(Path(directory) / STATE_FILE, map_location="cpu", weights_only=True)
        best_file = Path(directory) / BEST_FILE
        if best_file.is_file():  # checkpoints before best.safetensors kept "best" in state.pt
            with safe_open(str(best_file), framework="pt") as f:
                about = f.metadata()
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no iterator
            state["best"] = {"val_acc": float(about["val_acc"]), "step": int(about["step"]), "trainable": tensors}
    return state
