"""One finetuning run: build, freeze, train with warm-up + cosine and clipping, evaluate, checkpoint.

``finetune(config)`` is a plain function with no Ray or MLflow in it; ``run/trainable.py`` wraps it for
Ray Tune. It calls ``report(metrics, state)`` after every evaluation; ``state`` (only the
trainable tensors, the optimizer and the step; live, so save or copy it in the call) resumes the run
exactly where it stopped. It returns the trained model (its best-validation weights) with the final metrics.

The run's jobs live in their own modules: ``vit.building`` (the model, splits and forward pass), ``vit.optim``
(optimizer, schedule, step), ``vit.loop`` (the run's state, the step, the evaluations between steps),
``vit.evaluation`` (scoring a split) and ``vit.timing`` (the dry run's timed steps); this module is their face.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data.decoded import InMemory
from vitplast_tune.typed import checked
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
    """The trained model and its final metrics, as ``finetune`` returns them.

    Unpacks as ``model, metrics = finetune(cfg)``.

    Attributes:
        model: The trained timm model, holding its best-validation weights, in eval mode on the device it trained on.
        metrics: The metrics of the last evaluation (``test_acc``: that model on the test split).
    """

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
    """Finetune ``cfg.components`` of ``cfg.model`` on ``cfg.dataset``; return the trained model and the final metrics.

    After every ``eval_every`` steps (and the last), ``report(metrics, state)`` receives the metrics (step,
    train_loss, val_acc, val_loss, best_val_acc, current_lr, trainable_params, steps_per_s, images_per_s) and a
    resumable state of live tensors (save or copy it during the call: training goes on). At the end the
    best-validation weights are tested (``test_acc``), as in the paper. A linear probe on in-memory data trains its
    head on the backbone's features, cached once.

    Args:
        cfg: the run's settings.
        report: called after every evaluation with (metrics, state), or None.
        resume: a state a run of the same settings reported, to go on from, or None.
        device: where to train (default: ``run_device()``).
        decoded: the dataset already decoded (shared by the search), or None.
        world: this process's place among the run's data-parallel workers (``vit.distributed``), which train on their
            shares of every batch and evaluate their shares of each split; the metrics are the whole run's on each.

    Returns:
        ``Finetuned(model, metrics)``: the model with the best-validation weights (of the EMA, when the recipe has
        one), in eval mode, and the last evaluation's metrics.

    Raises:
        DivergedError: on a NaN or infinite loss.
        UserError: on settings that cannot train.
    """
    cfg.validate()
    recipe.check(cfg)
    entered = time.perf_counter()
    run = loop.prepare(cfg, device or run_device(), decoded=decoded, world=world)
    if resume is not None:
        run.load(resume)
    world.broadcast([*run.learner.trainable.values(), *run.learner.ema_tensors().values()])  # every worker alike
    batches, val_batches = loop.batches(run)
    # Cumulative seconds of the run, a resumed run's from its first start (what it cost in all): setup (model, data,
    # freezing, feature cache), training steps (up to the loss sync at each evaluation), evaluation (val and test).
    timing = run.progress.timing
    timing["time_setup_s"] = timing.get("time_setup_s", 0.0) + time.perf_counter() - entered
    timing.setdefault("time_in_steps_s", 0.0)
    timing.setdefault("time_in_eval_s", 0.0)
    metrics: dict[str, Any] = {}
    while run.progress.step < cfg.max_steps:
        started = time.perf_counter()
        loss_sum, count = loop.train_until_evaluation(run, batches)
        train_loss = world.sum(loss_sum).item() / (count * world.size)
        metrics = loop.evaluate_run(run, val_batches, train_loss=train_loss, count=count, started=started)
        if report is not None:
            report(metrics, run.state())
    loop.restore_best(run)
    return Finetuned(run.learner.model.eval(), metrics)
