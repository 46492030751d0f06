"""Run one finetuning trial as a Ray Tune trainable that reports, checkpoints and resumes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vitplast_tune.config import FinetuneConfig, trial_config
from vitplast_tune.run.checkpoints import _checkpoint_directory, checkpoint_due, diverged, read_checkpoint

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
    """Finetune one trial and report each evaluation to Tune, resuming from Tune's checkpoint.

    Args:
        config: The trial's sampled settings.
        settings: The search-wide settings they override.
        decoded: The dataset the driver decoded once and shared through the object store.
        max_trainable_params: The search's parameter budget.
        staged: The driver's files the run reads.
        workers: The trial's data-parallel workers (default: one, in this process).
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
    """Pass a Train run's report to Tune, copying its checkpoint into the trial's."""
    from ray import tune

    if checkpoint is not None:
        checkpoint = tune.Checkpoint(checkpoint.path, checkpoint.filesystem)
    tune.report(metrics, checkpoint=checkpoint)


def _train_here(cfg: FinetuneConfig, *, resume: dict[str, Any] | None, decoded: InMemory | None) -> None:
    """Finetune in this trial's process, reporting each evaluation; a diverged run reports NaN metrics."""
    from ray import tune

    from vitplast_tune.vit.training import DivergedError, finetune

    def report(metrics: dict[str, Any], state: dict[str, Any]) -> None:
        metrics = {**metrics, "diverged": 0, "node_id": _node_id()}
        if not checkpoint_due(metrics, cfg.eval_every, cfg.checkpoint_every):
            tune.report(metrics)
            return
        with _checkpoint_directory(state) as directory:
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))

    try:
        finetune(cfg, report=report, resume=resume, decoded=decoded)
    except DivergedError as exc:
        tune.report(diverged(exc, cfg))


def _node_id() -> str:
    """Return the id of the Ray node running this trial."""
    import ray

    return ray.get_runtime_context().get_node_id()
