"""Train one finetuning run: its state, the optimizer step over micro-batches, and the evaluations between steps."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data.batches import eval_batches, train_batches
from vitplast_tune.data.decoded import InMemory
from vitplast_tune.data.splits import Splits
from vitplast_tune.vit import building, methods, recipe
from vitplast_tune.vit.devices import device_facts, resolve_precision
from vitplast_tune.vit.distributed import SINGLE, World, _check_batch, _shard, _syncing, data_parallel
from vitplast_tune.vit.evaluation import _eval_batch_size, autocast, evaluate
from vitplast_tune.vit.families.registry import family_of
from vitplast_tune.vit.optim import _set_lr, backward, build_optimizer, optimizer_step, warmup_cosine

Forward = Callable[[torch.Tensor], torch.Tensor]


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite.

    Args:
        message: What went wrong.
        step: The optimizer step at which the loss stopped being finite.
    """

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


@dataclass
class Place:
    """Where a run computes: its device, resolved precision, data-parallel world and DataLoader workers."""

    device: torch.device
    precision: str
    world: World = SINGLE
    loader_workers: int = 0


@dataclass
class Learner:
    """What a run trains, and what it trains with.

    ``forward`` is the model, compiled, or the head on cached features; ``trained`` is ``forward`` in DDP, when there
    are several workers.
    """

    model: nn.Module
    forward: Forward
    trained: nn.Module
    trainable: dict[str, nn.Parameter]
    trainable_params: int
    optimizer: torch.optim.Optimizer
    loss: recipe.Loss
    scaler: torch.amp.GradScaler | None = None  # fp16 only
    ema: Any = None  # timm's ModelEmaV3 of the model when the recipe has one
    ema_forward: Forward | None = None  # the EMA's forward (as ``forward`` is)

    def evaluated(self) -> tuple[nn.Module, Forward]:
        """Return the model evaluations score and its forward pass: the EMA's when the recipe has one."""
        return (self.ema.module, self.ema_forward) if self.ema is not None else (self.model, self.forward)

    def ema_tensors(self) -> dict[str, torch.Tensor]:
        """Return the EMA's values of the trainable tensors by name; none without an EMA."""
        if self.ema is None:
            return {}
        params = dict(self.ema.module.named_parameters())
        return {name: params[name].detach() for name in self.trainable}


@dataclass
class Progress:
    """How far a run got: its steps, the fp16 steps skipped, the best validation so far and its seconds."""

    step: int = 0
    skipped_steps: int = 0
    best: dict[str, Any] = field(default_factory=lambda: {"val_acc": -1.0, "step": 0, "trainable": None})
    timing: dict[str, float] = field(default_factory=dict)


@dataclass
class Run:
    """A run being finetuned, built by ``_prepare``."""

    cfg: FinetuneConfig
    place: Place
    learner: Learner
    splits: Splits
    progress: Progress = field(default_factory=Progress)

    def lr(self, step: int) -> float:
        """Return the learning rate at ``step``."""
        return self.cfg.lr * warmup_cosine(step, self.cfg.max_steps, self.cfg.warmup)

    def state(self) -> dict[str, Any]:
        """Return what resumes the run: live tensors, which the receiver saves or copies before training goes on."""
        learner, progress = self.learner, self.progress
        trainable = {n: p.detach() for n, p in learner.trainable.items()}
        state = {
            "step": progress.step,
            "trainable": trainable,
            "optimizer": learner.optimizer.state_dict(),
            "best": progress.best,
            "timing": dict(progress.timing),  # a resumed run adds to these
        }
        if learner.scaler is not None:
            state["scaler"] = learner.scaler.state_dict()
        if learner.ema is not None:
            state["ema"] = learner.ema_tensors()
        return state

    def load(self, state: dict[str, Any]) -> None:
        """Go on from a ``state`` that a run of the same settings reported, adding its seconds to this run's.

        A state without an EMA resumes the EMA from the trainable weights.
        """
        learner = self.learner
        with torch.no_grad():
            for name, tensor in state["trainable"].items():
                learner.trainable[name].copy_(tensor)
            for name, tensor in learner.ema_tensors().items():
                tensor.copy_(state.get("ema", state["trainable"])[name])
        learner.optimizer.load_state_dict(state["optimizer"])
        if learner.scaler is not None and "scaler" in state:
            learner.scaler.load_state_dict(state["scaler"])
        self.progress.step, self.progress.best = int(state["step"]), state["best"]
        timing = self.progress.timing
        for key, seconds in state.get("timing", {}).items():
            timing[key] = timing.get(key, 0.0) + float(seconds)


def _prepare(cfg: FinetuneConfig, device: torch.device, *, decoded: InMemory | None, world: World = SINGLE) -> Run:
    """Build a run at step 0: the model frozen but for the subset, its forward pass, optimizer, loss and EMA."""
    building._use_hardware(cfg, device)
    _check_batch(cfg.batch_size, world, cfg.mixup > 0 or cfg.cutmix > 0)
    precision = resolve_precision(cfg.precision, device)
    model, splits = building.build_run(cfg, decoded)
    counts = methods.apply_methods(model, cfg)  # inject LoRA where asked, freeze the rest
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    family_of(model).set_grad_checkpointing(model, cfg.grad_checkpointing)
    model.to(device).train()
    splits, module, feature_cache_s = building._forward_pass(cfg, model, splits, device=device, precision=precision)
    ema = recipe.weight_average(cfg, model)  # copy the model before DDP wraps it
    compiled = cfg.compile and not isinstance(module, building.HeadOnTokens)
    forward = torch.compile(module) if compiled else module
    trained = data_parallel(module, world, device)  # evaluations score each worker's share without DDP
    trained = forward if trained is module else torch.compile(trained) if compiled else trained
    cached = isinstance(splits.train, TensorDataset)  # the EMA's head reads the cached features too
    learner = Learner(
        model,
        forward,
        trained,
        trainable,
        sum(counts.values()),
        build_optimizer(cfg, model, device),
        recipe.training_loss(cfg, splits.num_classes),
        scaler=torch.amp.GradScaler(device.type) if precision == "fp16" else None,
        ema=ema,
        ema_forward=None if ema is None else building.HeadOnTokens(ema.module) if cached else ema.module,
    )
    place = Place(device, precision, world, building._loader_workers(cfg, splits))
    return Run(cfg, place, learner, splits, Progress(timing={"time_feature_cache_s": feature_cache_s}))


def _batches(run: Run) -> tuple[Iterator, Iterator]:
    """Return this worker's training batches, from where the run stands, and its validation batches."""
    cfg, place, world = run.cfg, run.place, run.place.world
    train = train_batches(
        run.splits.train,
        cfg.batch_size,
        seed=cfg.seed,
        start_step=run.progress.step * cfg.grad_accum_steps,  # in micro-batches
        num_workers=place.loader_workers,
        device=place.device,
        part=(world.rank, world.size),
    )
    val = eval_batches(
        _shard(run.splits.val, world), _eval_batch_size(cfg.batch_size), place.loader_workers, place.device
    )
    return train, val


def _train_until_evaluation(run: Run, batches: Iterator) -> tuple[torch.Tensor, int]:
    """Train up to the next evaluation; return the steps' summed loss and their count."""
    loss_sum, count = torch.zeros((), device=run.place.device), 0
    while True:
        loss_sum += _train_step(run, batches)
        count += 1
        step = run.progress.step
        if step % run.cfg.eval_every == 0 or step == run.cfg.max_steps:
            return loss_sum, count


def _train_step(run: Run, batches: Iterator) -> torch.Tensor:
    """Take one optimizer step over ``grad_accum_steps`` micro-batches; return its mean loss."""
    cfg, place, learner, progress = run.cfg, run.place, run.learner, run.progress
    _set_lr(learner.optimizer, run.lr(progress.step))
    total = torch.zeros((), device=place.device)
    for micro in range(cfg.grad_accum_steps):
        images, labels = (t.to(place.device, non_blocking=True) for t in next(batches))
        seed = recipe._mix_seed(cfg.seed, progress.step, micro, place.world.rank)
        images, targets = learner.loss.targets(images, labels, seed)
        with _syncing(learner.trained, last=micro == cfg.grad_accum_steps - 1):  # DDP averages on the last
            with autocast(place.device, place.precision):
                loss = learner.loss(learner.trained(images).float(), targets)
            backward(loss / cfg.grad_accum_steps, learner.scaler)
        total += loss.detach()
    if not optimizer_step(
        learner.optimizer, learner.trainable.values(), grad_clip=cfg.grad_clip, scaler=learner.scaler
    ):
        progress.skipped_steps += 1
    if learner.ema is not None:
        learner.ema.update(learner.model, step=progress.step + 1)  # count updates as timm's train.py does
    progress.step += 1
    return total / cfg.grad_accum_steps


def _evaluate_run(run: Run, val_batches, *, train_loss: float, count: int, started: float) -> dict[str, Any]:
    """Validate, test the best weights after the last step, and return the metrics; DivergedError on a NaN loss."""
    cfg, place, learner, progress = run.cfg, run.place, run.learner, run.progress
    step, evaluating = progress.step, time.perf_counter()
    progress.timing["time_in_steps_s"] += evaluating - started
    if not math.isfinite(train_loss):
        raise DivergedError(f"training loss became {train_loss} before step {step}", step)
    scored, forward = learner.evaluated()
    val = _evaluate(run, scored, forward, val_batches, num_workers=place.loader_workers)
    if val["acc"] > progress.best["val_acc"]:
        kept = learner.ema_tensors() or learner.trainable
        progress.best = {"val_acc": val["acc"], "step": step, "trainable": _snapshot(kept)}
    steps_per_s = count / (evaluating - started)
    metrics = {
        "step": step,
        "train_loss": train_loss,
        "val_acc": val["acc"],
        "val_loss": val["loss"],
        "best_val_acc": progress.best["val_acc"],
        "best_step": progress.best["step"],
        "current_lr": run.lr(step - 1),
        "trainable_params": learner.trainable_params,
        "max_steps": cfg.max_steps,
        "steps_per_s": steps_per_s,
        "images_per_s": steps_per_s * cfg.batch_size * cfg.grad_accum_steps,  # the Pareto front's throughput axis
        "amp_skipped_steps": progress.skipped_steps,  # fp16 steps skipped on overflow
        "workers": place.world.size,
        **device_facts(place.device),
        "precision": place.precision,
    }
    if step == cfg.max_steps and cfg.eval_test:
        test = _test_best(run)
        metrics.update(test_acc=test["acc"], test_loss=test["loss"])
        if "correct" in test:  # one worker: the criteria lab keeps it
            metrics["test_correct"] = test["correct"]
    progress.timing["time_in_eval_s"] += time.perf_counter() - evaluating
    return _per_gpu_hour({**metrics, **progress.timing})


def _per_gpu_hour(metrics: dict[str, Any]) -> dict[str, Any]:
    """Add the validation accuracy per hour of the run's training steps to the metrics."""
    return {**metrics, "val_acc_per_gpu_hour": metrics["val_acc"] * 3600 / max(metrics["time_in_steps_s"], 1e-9)}


def _restore_best(run: Run) -> None:
    """Put the best-validation weights, if any, into the run's trainable parameters."""
    best, trainable = run.progress.best, run.learner.trainable
    if best["trainable"] is not None:
        with torch.no_grad():
            for name, tensor in best["trainable"].items():
                trainable[name].copy_(tensor)


def _test_best(run: Run) -> dict[str, Any]:
    """Test the best-validation weights, which the model keeps afterwards."""
    _restore_best(run)
    return _evaluate(run, run.learner.model, run.learner.forward, run.splits.test, per_image=True)


def _evaluate(run: Run, model: nn.Module, forward: Forward, dataset: Any, **options: Any) -> dict[str, Any]:
    """Score ``model`` through ``forward`` where the run computes."""
    place = run.place
    return evaluate(
        model,
        dataset,
        batch_size=run.cfg.batch_size,
        device=place.device,
        forward=forward,
        precision=place.precision,
        world=place.world,
        **options,
    )


def _snapshot(params: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in params.items()}
