"""Finetune one run: build, freeze, train, evaluate and checkpoint, with no Ray or MLflow.

``run/trainable.py`` wraps ``finetune`` for Ray Tune.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data.decoded import InMemory
from vitplast_tune.type_checks import checked
from vitplast_tune.vit import loop, recipe
from vitplast_tune.vit.building import build_run, create_run_model
from vitplast_tune.vit.devices import run_device
from vitplast_tune.vit.distributed import SINGLE, World
from vitplast_tune.vit.evaluation import evaluate
from vitplast_tune.vit.loop import DivergedError
from vitplast_tune.vit.timing import time_steps

__all__ = [
    "DivergedError",
    "FinetuneConfig",
    "Finetuned",
    "Report",
    "build_run",
    "create_run_model",
    "evaluate",
    "finetune",
    "time_steps",
]

Report = Callable[[dict[str, Any], dict[str, Any]], None]


class Finetuned(NamedTuple):
    """The trained model and its final metrics: ``model, metrics = finetune(cfg)``."""

    model: nn.Module
    metrics: dict[str, Any]


@checked()
def finetune(
    cfg: FinetuneConfig,
    *,
    report: Report | None = None,
    resume: dict[str, Any] | None = None,
    device: torch.device | None = None,
    decoded: InMemory | None = None,
    world: World = SINGLE,
) -> Finetuned:
    """Finetune ``cfg.components`` of ``cfg.model`` on ``cfg.dataset``, and return the model and its metrics.

    After every ``eval_every`` steps and the last, ``report(metrics, state)`` gets the metrics and a resumable state of
    live tensors; save or copy the state during the call. The best-validation weights are tested at the end.

    Args:
        cfg: The run's settings.
        report: Called after every evaluation, or None.
        resume: A state a run of the same settings reported, to go on from, or None.
        device: Where to train (default: ``run_device()``).
        decoded: The dataset already decoded, or None.
        world: This process's place among the run's data-parallel workers.

    Returns:
        The model with its best-validation weights (the EMA's, when the recipe has one) and the last metrics.

    Raises:
        DivergedError: The loss became NaN or infinite.
        UserError: The settings cannot train.
    """
    cfg.validate()
    recipe.check(cfg)
    entered = time.perf_counter()
    run = loop._prepare(cfg, device or run_device(), decoded=decoded, world=world)
    if resume is not None:
        run.load(resume)
    world.broadcast([*run.learner.trainable.values(), *run.learner.ema_tensors().values()])  # start every worker alike
    batches, val_batches = loop._batches(run)
    # Seconds of setup, steps and evaluation, summed from the run's first start over every resume.
    timing = run.progress.timing
    timing["time_setup_s"] = timing.get("time_setup_s", 0.0) + time.perf_counter() - entered
    timing.setdefault("time_in_steps_s", 0.0)
    timing.setdefault("time_in_eval_s", 0.0)
    metrics: dict[str, Any] = {}
    while run.progress.step < cfg.max_steps:
        started = time.perf_counter()
        loss_sum, count = loop._train_until_evaluation(run, batches)
        train_loss = world.sum(loss_sum).item() / (count * world.size)
        metrics = loop._evaluate_run(run, val_batches, train_loss=train_loss, count=count, started=started)
        if report is not None:
            report(metrics, run.state())
    loop._restore_best(run)
    return Finetuned(run.learner.model.eval(), metrics)
