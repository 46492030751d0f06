"""One finetuning run as a Ray Tune trainable: report, checkpoint, resume.

``train_trial(config, settings)`` merges the trial's sampled ``config`` over the search-wide
``settings`` (a FinetuneConfig), resumes from ``tune.get_checkpoint()`` when Tune
restarts it, and reports metrics with a checkpoint of the trainable state after every evaluation.
A NaN or infinite loss ends the trial with ``diverged=1`` and the reason, instead of a retry
that would diverge again. A trial whose subset trains more parameters than the search's budget
(``max_trainable_params``) is not trained: it reports ``over_budget=1`` at step 0 with a NaN metric,
which the search's OptunaSearcher records as PRUNED (stopped before its budget).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplast_tune.components import ALL, subset_name
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.search.distributions import ENCODING_KEYS

if TYPE_CHECKING:  # torch and the training code load in the trial's process, not in the search's driver
    from vitplast_tune.data.decoded import InMemory

STATE_FILE = "state.pt"
# What every report of a trial carries that a search can optimise, and the mode in which it is better.
METRICS = {
    "val_acc": "max",
    "best_val_acc": "max",
    "val_loss": "min",
    "train_loss": "min",
    "trainable_params": "min",
    "images_per_s": "max",
}  # the last two: second objectives (Pareto)


def trial_config(config: dict[str, Any], settings: FinetuneConfig) -> FinetuneConfig:
    """The FinetuneConfig of a trial: its sampled parameters over the search's settings."""
    return settings.merged({k: v for k, v in config.items() if k not in ENCODING_KEYS})


def trainable_parameters(cfg: FinetuneConfig) -> int:
    """How many parameters a run of ``cfg`` trains (its subset by their methods, blocks and head), counted on an
    untrained model."""
    from vitplast_tune.data import datasets
    from vitplast_tune.vit import methods, models

    model = models.create_model(cfg.model, datasets.num_classes(cfg.dataset, data_dir=cfg.data_dir), pretrained=False)
    return sum(methods.apply_methods(model, cfg).values())


def train_trial(
    config: dict[str, Any],
    settings: FinetuneConfig,
    decoded: InMemory | None = None,
    max_trainable_params: int | None = None,
) -> None:
    """Ray Tune function trainable for one finetuning run (see the module docstring).

    ``decoded`` is the dataset the driver decoded once and shared through the object store;
    ``max_trainable_params`` the search's parameter budget.
    """
    import torch
    from ray import tune

    from vitplast_tune.vit.training import DivergedError, finetune

    cfg = trial_config(config, settings)
    if max_trainable_params is not None and (count := trainable_parameters(cfg)) > max_trainable_params:
        over = {"over_budget": 1, "trainable_params": count, "step": 0, "max_steps": cfg.max_steps}
        tune.report({**over, "val_acc": float("nan")})
        return
    checkpoint = tune.get_checkpoint()
    resume = None
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            resume = torch.load(Path(directory) / STATE_FILE, map_location="cpu", weights_only=True)

    def report(metrics: dict[str, Any], state: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as directory:
            torch.save(state, Path(directory) / STATE_FILE)
            tune.report(
                {**metrics, "diverged": 0, "node_id": _node_id()}, checkpoint=tune.Checkpoint.from_directory(directory)
            )

    try:
        finetune(cfg, report=report, resume=resume, decoded=decoded)
    except DivergedError as exc:
        # The metrics are NaN so that Optuna records the trial as failed; no checkpoint, no retry.
        nan = {metric: float("nan") for metric in METRICS}
        tune.report({**nan, "diverged": 1, "error": str(exc), "step": exc.step, "max_steps": cfg.max_steps})


def _node_id() -> str:
    """The id of the Ray node running this trial: the MLflow tracker tags the child run with it (cluster.py)."""
    import ray

    return ray.get_runtime_context().get_node_id()


def trial_subset(config: dict[str, Any]) -> str:
    """The subset a trial's config trains, by its canonical name ("all" when the space names none)."""
    return subset_name(config.get("components", ALL))
