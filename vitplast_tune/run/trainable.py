"""One finetuning run as a Ray Tune trainable: report, checkpoint, resume.

``train_trial(config, settings)`` merges the trial's sampled ``config`` over the search-wide
``settings`` (a FinetuneConfig), points its data and weights at this node's copies of the driver's files
(``data.staging``), resumes from ``tune.get_checkpoint()`` when Tune restarts it (on any node: checkpoints
live in the search's storage), and reports metrics after every evaluation, with a checkpoint every
``checkpoint_every`` evaluations, whenever the best validation accuracy improves, and at the last step. A
checkpoint holds ``state.pt`` (the trainable tensors, the optimizer and the step) and ``best.safetensors`` (the
best-validation trainable tensors, its step and accuracy as metadata), which the driver logs for the best trial.
A NaN or infinite loss ends the trial with ``diverged=1`` and the reason, instead of a retry
that would diverge again. A trial whose subset trains more parameters than the search's budget
(``max_trainable_params``) is not trained: it reports ``over_budget=1`` at step 0 with a NaN metric,
which the search's OptunaSearcher records as PRUNED (stopped before its budget).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplast_tune.config import METRICS, FinetuneConfig, trial_config
from vitplast_tune.storage import BEST_FILE, STATE_FILE

if TYPE_CHECKING:  # torch and the training code load in the trial's process, not in the search's driver
    from vitplast_tune.data.decoded import InMemory
    from vitplast_tune.data.staging import Staged


def train_trial(
    config: dict[str, Any],
    settings: FinetuneConfig,
    decoded: InMemory | None = None,
    max_trainable_params: int | None = None,
    staged: Sequence[Staged] = (),
) -> None:
    """Ray Tune function trainable for one finetuning run (see the module docstring).

    ``decoded`` is the dataset the driver decoded once and shared through the object store;
    ``max_trainable_params`` the search's parameter budget; ``staged`` the driver's files the run reads.
    """
    from ray import tune

    from vitplast_tune.data import staging
    from vitplast_tune.run import parallel
    from vitplast_tune.vit.methods import trainable_parameters
    from vitplast_tune.vit.training import DivergedError

    cfg = staging.localize(trial_config(config, settings), staged)
    if max_trainable_params is not None and (count := trainable_parameters(cfg)) > max_trainable_params:
        over = {"over_budget": 1, "trainable_params": count, "step": 0, "max_steps": cfg.max_steps}
        tune.report({**over, "val_acc": float("nan")})
        return
    resume = read_checkpoint(tune.get_checkpoint())

    def report(metrics: dict[str, Any], state: dict[str, Any]) -> None:
        metrics = {**metrics, "diverged": 0, "node_id": _node_id()}
        if not checkpoint_due(metrics, cfg.eval_every, cfg.checkpoint_every):
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory() as directory:
            write_checkpoint(Path(directory), state)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))

    try:
        parallel.finetune(cfg, report=report, resume=resume, decoded=decoded)  # one worker, or data-parallel
    except DivergedError as exc:
        # The metrics are NaN so that Optuna records the trial as failed; no checkpoint, no retry.
        nan = {metric: float("nan") for metric in METRICS}
        tune.report({**nan, "diverged": 1, "error": str(exc), "step": exc.step, "max_steps": cfg.max_steps})


def checkpoint_due(metrics: dict[str, Any], eval_every: int, every: int) -> bool:
    """Whether a report of ``metrics`` carries a checkpoint: every ``every``-th evaluation, when the best validation
    accuracy improved at this step (the best weights are never lost), and at the last step."""
    step = int(metrics["step"])
    evaluation = -(-step // eval_every)  # the last evaluation may come before a whole eval_every
    return evaluation % every == 0 or metrics.get("best_step") == step or step >= int(metrics["max_steps"])


def write_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    """A run's ``finetune`` state as checkpoint files in ``directory``: ``state.pt`` (step, trainable tensors,
    optimizer, the EMA's tensors when the recipe has one) and ``best.safetensors`` (the best-validation trainable
    tensors; its step and accuracy as metadata)."""
    import torch
    from safetensors.torch import save_file

    best = state["best"]
    torch.save({k: state[k] for k in ("step", "trainable", "optimizer", "ema") if k in state}, directory / STATE_FILE)
    tensors = best["trainable"] if best["trainable"] is not None else state["trainable"]
    about = {"step": str(best["step"]), "val_acc": repr(float(best["val_acc"]))}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / BEST_FILE), metadata=about)


def read_checkpoint(checkpoint) -> dict[str, Any] | None:
    """The ``finetune`` state a Tune checkpoint holds (None for none), read through its filesystem (any storage)."""
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


def _node_id() -> str:
    """The id of the Ray node running this trial: the MLflow tracker tags the child run with it."""
    import ray

    return ray.get_runtime_context().get_node_id()
