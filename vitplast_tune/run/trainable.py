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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vitplast_tune.config import FinetuneConfig, trial_config
from vitplast_tune.run.checkpoints import checkpoint_directory, checkpoint_due, diverged, read_checkpoint

if TYPE_CHECKING:  # torch and the training code load in the trial's process, not in the search's driver
    from vitplast_tune.data.decoded import InMemory
    from vitplast_tune.data.staging import Staged
    from vitplast_tune.run.parallel import Workers


def train_trial(
    config: dict[str, Any],
    settings: FinetuneConfig,
    *,
    decoded: InMemory | None = None,
    max_trainable_params: int | None = None,
    staged: Sequence[Staged] = (),
    workers: Workers | None = None,
) -> None:
    """Ray Tune function trainable for one finetuning run (see the module docstring).

    Args:
        config: the trial's sampled settings.
        settings: the search-wide settings they override.
        decoded: the dataset the driver decoded once and shared through the object store.
        max_trainable_params: the search's parameter budget.
        staged: the driver's files the run reads.
        workers: the trial's data-parallel workers (default: one, in this process).
    """
    from ray import tune

    from vitplast_tune.data import staging
    from vitplast_tune.run import parallel
    from vitplast_tune.vit.methods import trainable_parameters

    cfg = staging.localize(trial_config(config, settings), staged)
    if max_trainable_params is not None and (count := trainable_parameters(cfg)) > max_trainable_params:
        over = {"over_budget": 1, "trainable_params": count, "step": 0, "max_steps": cfg.max_steps}
        tune.report({**over, "val_acc": float("nan")})
        return
    if workers is not None and workers.count > 1:  # a Ray Train run, its reports relayed to Tune
        parallel.train_on_workers(cfg, workers, relay=_report_to_tune, resume=tune.get_checkpoint(), decoded=decoded)
        return
    _train_here(cfg, resume=read_checkpoint(tune.get_checkpoint()), decoded=decoded)


def _report_to_tune(metrics: dict[str, Any], checkpoint) -> None:
    """Report a Train run's report to Tune, its checkpoint (in Train's storage, or None) copied into the trial's."""
    from ray import tune

    if checkpoint is not None:
        checkpoint = tune.Checkpoint(checkpoint.path, checkpoint.filesystem)
    tune.report(metrics, checkpoint=checkpoint)


def _train_here(cfg: FinetuneConfig, *, resume: dict[str, Any] | None, decoded: InMemory | None) -> None:
    """``vit.training.finetune`` in this trial's process, each evaluation reported to Tune (with a checkpoint when
    due); a diverged run reports NaN metrics, ``diverged=1`` and the reason."""
    from ray import tune

    from vitplast_tune.vit.training import DivergedError, finetune

    def report(metrics: dict[str, Any], state: dict[str, Any]) -> None:
        metrics = {**metrics, "diverged": 0, "node_id": _node_id()}
        if not checkpoint_due(metrics, cfg.eval_every, cfg.checkpoint_every):
            tune.report(metrics)
            return
        with checkpoint_directory(state) as directory:
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))

    try:
        finetune(cfg, report=report, resume=resume, decoded=decoded)
    except DivergedError as exc:
        tune.report(diverged(exc, cfg))


def _node_id() -> str:
    """The id of the Ray node running this trial: the MLflow tracker tags the child run with it."""
    import ray

    return ray.get_runtime_context().get_node_id()
