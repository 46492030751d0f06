"""One finetuning run: build, freeze, train with warm-up + cosine and clipping, evaluate, checkpoint.

``finetune(config)`` is a plain function with no Ray or MLflow in it; ``run/trainable.py`` wraps it for
Ray Tune. It calls ``report(metrics, state)`` after every evaluation; ``state`` (only the
trainable tensors, the optimizer and the step; live, so save or copy it in the call) resumes the run
exactly where it stopped. It returns the trained model (its best-validation weights) with the final metrics.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from vitplast_tune import components
from vitplast_tune.config import FinetuneConfig  # re-exported: training.FinetuneConfig
from vitplast_tune.data import datasets, transforms
from vitplast_tune.data.batches import eval_batches, train_batches
from vitplast_tune.data.decoded import InMemory
from vitplast_tune.data.splits import SmallImages, Splits
from vitplast_tune.vit import methods, models, recipe
from vitplast_tune.vit.devices import device_facts, resolve_precision, run_device
from vitplast_tune.vit.distributed import SINGLE, World, check_batch, shard
from vitplast_tune.vit.families.registry import family_of


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite at ``step``."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


Report = Callable[[dict[str, Any], dict[str, Any]], None]


class Finetuned(NamedTuple):
    """What ``finetune`` returns: the trained timm model, holding its best-validation weights, in eval mode on the
    device it trained on, and the metrics of the last evaluation (``test_acc``: that model on the test split).
    Unpacks as ``model, metrics = finetune(cfg)``."""

    model: nn.Module
    metrics: dict[str, Any]


def warmup_cosine(step: int, total_steps: int, warmup_steps: int) -> float:
    """Learning-rate multiplier at ``step``: linear warm-up to 1, then cosine decay to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def build_optimizer(cfg: FinetuneConfig, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """timm's ``create_optimizer_v2`` over the model's trainable parameters: SGD with classical momentum or AdamW, no
    weight decay on biases, norms and the model's ``no_weight_decay()`` tokens (position embedding, class token),
    layer-wise lr decay with ``layer_decay`` (each group's ``lr_scale``), fused kernels on CUDA with ``cuda_options``."""
    from timm.optim import create_optimizer_v2

    fused = {"fused": True} if cfg.cuda_options and device.type == "cuda" else {}
    return create_optimizer_v2(
        model,
        {"sgd": "momentum", "adamw": "adamw"}[cfg.optimizer],  # timm's "sgd" is Nesterov; "momentum" is classical
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        momentum=cfg.momentum,
        layer_decay=cfg.layer_decay,
        **fused,
    )


def amp_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, params, grad_clip: float, scaler=None) -> bool:
    """Backward pass, gradient clipping at ``grad_clip`` (0: none) and the optimizer step; with a ``GradScaler`` (fp16)
    the loss is scaled, the gradients unscaled before clipping, and a step whose gradients overflowed is skipped.
    Returns whether the optimizer stepped; the gradients are freed either way."""
    backward(loss, scaler)
    return optimizer_step(optimizer, params, grad_clip, scaler)


def backward(loss: torch.Tensor, scaler=None) -> None:
    """The backward pass of ``loss`` (scaled by the ``GradScaler`` under fp16), adding to the gradients."""
    (loss if scaler is None else scaler.scale(loss)).backward()


def optimizer_step(optimizer: torch.optim.Optimizer, params, grad_clip: float, scaler=None) -> bool:
    """Clip the gradients at ``grad_clip`` (0: none; unscaled first under fp16) and step; with a ``GradScaler`` a step
    whose gradients overflowed is skipped. Returns whether the optimizer stepped; the gradients are freed either way."""
    params = list(params)
    if scaler is None:
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        optimizer.step()
        stepped = True
    else:
        if grad_clip > 0:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        scale = scaler.get_scale()
        scaler.step(optimizer)  # skipped when a gradient is inf or NaN
        scaler.update()  # which then lowers the scale
        stepped = scaler.get_scale() >= scale
    # Freed now, not before the next backward: the forward pass's activations and an evaluation never
    # sit beside a whole set of stale gradients (a ViT-B's are 0.34 GB).
    optimizer.zero_grad(set_to_none=True)
    return stepped


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    dataset,
    batch_size: int,
    device: torch.device,
    num_workers: int = 0,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
    precision: str = "fp32",
    world: World = SINGLE,
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` (or of ``forward``) over ``dataset`` (or its ``eval_batches``), in
    ``precision`` (resolved on ``device``); with data-parallel workers (``world``) each scores its share of a dataset
    (batches given: this worker's share of them) and the result is the whole's."""
    forward = model if forward is None else forward  # not `or`: a compiled module has no truth value
    was_training = model.training
    model.eval()
    dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
    sums = torch.zeros(3, device=device, dtype=dtype)  # correct, summed loss, images
    batches = (
        eval_batches(shard(dataset, world), eval_batch_size(batch_size), num_workers, device)
        if isinstance(dataset, Dataset)
        else dataset
    )
    for images, labels in batches:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with _autocast(device, precision):
            logits = forward(images)
        sums[0] += (logits.argmax(-1) == labels).sum()
        sums[1] += F.cross_entropy(logits.float(), labels, reduction="sum")
        sums[2] += len(labels)
    model.train(was_training)
    correct, loss_sum, count = world.sum(sums).tolist()
    return {"acc": correct / max(count, 1), "loss": loss_sum / max(count, 1)}


def finetune(
    cfg: FinetuneConfig,
    report: Report | None = None,
    resume: dict[str, Any] | None = None,
    device: torch.device | None = None,
    decoded: InMemory | None = None,
    world: World = SINGLE,
) -> Finetuned:
    """Finetune ``cfg.components`` of ``cfg.model`` on ``cfg.dataset``; return the trained model and the final metrics.

    After every ``eval_every`` steps (and the last), ``report(metrics, state)`` receives the
    metrics (step, train_loss, val_acc, val_loss, best_val_acc, current_lr, trainable_params, steps_per_s,
    images_per_s) and a resumable state of live tensors (save or copy it during the call: training goes on).
    When training ends, the best-validation weights are evaluated on the test
    split (``test_acc``), as in the paper. ``decoded`` is the dataset already decoded (shared by
    the search). The model returned holds the best-validation weights (of the EMA, when the recipe has one), in eval
    mode. Raises DivergedError on a NaN or infinite loss. ``world``: this process's place among the run's
    data-parallel workers (``vit.distributed``), which train on their shares of every batch and evaluate their
    shares of each split; the metrics are the whole run's on each.

    Frozen parameters get no gradient and no optimizer state, and autograd stops below the lowest
    trainable component. A head-only run (the linear probe) on an in-memory dataset passes each
    image through the frozen backbone once and trains the head on the cached features.
    """
    cfg.validate()
    recipe.check(cfg)
    entered = time.perf_counter()
    run = _prepare(cfg, device or run_device(), decoded, world)
    if resume is not None:
        _load_state(resume, run)
    world.broadcast([*run.trainable.values(), *run.ema_tensors().values()])  # every worker starts alike
    splits, workers = run.splits, run.workers
    start = run.step * cfg.grad_accum_steps  # micro-batches
    part = (world.rank, world.size)
    batches = train_batches(
        splits.train, cfg.batch_size, seed=cfg.seed, start_step=start, num_workers=workers, device=run.device, part=part
    )
    val_batches = eval_batches(shard(splits.val, world), eval_batch_size(cfg.batch_size), workers, run.device)
    # Cumulative seconds since this call (a resumed run starts again at 0): setup (model, data, freezing,
    # feature cache), training steps (up to the loss sync at each evaluation), evaluation (val and test).
    run.timing.update(time_setup_s=time.perf_counter() - entered, time_in_steps_s=0.0, time_in_eval_s=0.0)
    metrics: dict[str, Any] = {}
    while run.step < cfg.max_steps:
        started = time.perf_counter()
        loss_sum, count = _train_until_evaluation(run, batches)
        train_loss = world.sum(loss_sum).item() / (count * world.size)
        metrics = _evaluate_run(run, val_batches, train_loss, count, started)
        if report is not None:
            report(metrics, run.state())
    _restore_best(run.trainable, run.best)
    return Finetuned(run.model.eval(), metrics)


@dataclass
class _Run:
    """A run being finetuned: its model, what trains it, and where it stands (built by ``_prepare``)."""

    cfg: FinetuneConfig
    device: torch.device
    model: nn.Module
    forward: Callable[[torch.Tensor], torch.Tensor]  # the model, compiled, or the head on cached features
    splits: Splits
    trainable: dict[str, nn.Parameter]
    trainable_params: int
    optimizer: torch.optim.Optimizer
    workers: int
    timing: dict[str, float]
    precision: str  # resolved on the device: bf16, fp16 or fp32
    loss: recipe.Loss
    scaler: torch.amp.GradScaler | None = None  # fp16 only
    ema: Any = None  # timm's ModelEmaV3 of the model when the recipe has one
    ema_forward: Callable[[torch.Tensor], torch.Tensor] | None = None  # the EMA's forward (as ``forward`` is)
    world: World = SINGLE
    step: int = 0
    skipped_steps: int = 0  # fp16 steps the gradient scaler skipped (overflowed gradients)
    best: dict[str, Any] = field(default_factory=lambda: {"val_acc": -1.0, "step": 0, "trainable": None})

    def lr(self, step: int) -> float:
        """The learning rate at ``step``: warm-up, then cosine decay."""
        return self.cfg.lr * warmup_cosine(step, self.cfg.max_steps, self.cfg.warmup)

    def evaluated(self) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
        """The model that evaluations score and its forward pass: the EMA when the recipe has one, else the model."""
        return (self.ema.module, self.ema_forward) if self.ema is not None else (self.model, self.forward)

    def ema_tensors(self) -> dict[str, torch.Tensor]:
        """The EMA's values of the trainable tensors, by name (none without an EMA)."""
        if self.ema is None:
            return {}
        params = dict(self.ema.module.named_parameters())
        return {name: params[name].detach() for name in self.trainable}

    def state(self) -> dict[str, Any]:
        """What resumes the run: the live tensors, not copies (a copy of a ViT-B's weights and momentum is 0.7 GB),
        so the receiver saves or copies them before training goes on."""
        trainable = {n: p.detach() for n, p in self.trainable.items()}
        state = {"step": self.step, "trainable": trainable, "optimizer": self.optimizer.state_dict(), "best": self.best}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        if self.ema is not None:
            state["ema"] = self.ema_tensors()
        return state


def _prepare(cfg: FinetuneConfig, device: torch.device, decoded: InMemory | None, world: World = SINGLE) -> _Run:
    """Build the run: model and splits, frozen but for the subset, on ``device``, with its forward pass, optimizer,
    loss and EMA."""
    _use_hardware(cfg, device)
    check_batch(cfg.batch_size, world, cfg.mixup > 0 or cfg.cutmix > 0)
    precision = resolve_precision(cfg.precision, device)
    model, splits = build_run(cfg, decoded)
    counts = methods.apply_methods(model, cfg)  # LoRA adapters injected where asked, the rest frozen
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    family_of(model).set_grad_checkpointing(model, cfg.grad_checkpointing)
    model.to(device).train()
    splits, forward, feature_cache_s = _forward_pass(cfg, model, splits, device, precision)
    optimizer = build_optimizer(cfg, model, device)
    ema = recipe.weight_average(cfg, model)
    cached = isinstance(splits.train, TensorDataset)  # the backbone's features: the EMA's head reads them too
    ema_forward = None if ema is None else _head_forward(ema.module) if cached else ema.module
    return _Run(
        cfg,
        device,
        model,
        forward,
        splits,
        trainable,
        sum(counts.values()),
        optimizer,
        _num_workers(cfg, splits),
        {"time_feature_cache_s": feature_cache_s},
        precision,
        recipe.training_loss(cfg, splits.num_classes),
        scaler=torch.amp.GradScaler(device.type) if precision == "fp16" else None,
        ema=ema,
        ema_forward=ema_forward,
        world=world,
    )


def _forward_pass(cfg: FinetuneConfig, model: nn.Module, splits: Splits, device: torch.device, precision: str):
    """(splits, forward, seconds caching): a linear probe on in-memory data trains its head on the backbone's cached
    features (the splits become them, ``TensorDataset``s); otherwise the model, compiled with ``cfg.compile``."""
    family = family_of(model)
    probe = not components.parse_subset(cfg.components)
    if cfg.cache_features and probe and family.cache_features and _in_memory(splits):
        caching = time.perf_counter()
        splits = _backbone_features(model, splits, device, cfg.batch_size, precision)
        return splits, _head_forward(model), time.perf_counter() - caching
    return splits, torch.compile(model) if cfg.compile else model, 0.0


def _train_until_evaluation(run: _Run, batches) -> tuple[torch.Tensor, int]:
    """Training steps up to the next evaluation (every ``eval_every`` steps and the last); the summed loss and count."""
    loss_sum, count = torch.zeros((), device=run.device), 0
    while True:
        loss_sum += _train_step(run, batches)
        count += 1
        if run.step % run.cfg.eval_every == 0 or run.step == run.cfg.max_steps:
            return loss_sum, count


def _train_step(run: _Run, batches) -> torch.Tensor:
    """One optimizer step: the scheduled lr, then ``grad_accum_steps`` micro-batches (each mixed as the recipe says,
    its forward pass under autocast and its share of the loss backward), the gradients averaged over the workers,
    clipping and the optimizer step (``optimizer_step``), the EMA's update; the step's loss, not synchronised."""
    cfg = run.cfg
    for group in run.optimizer.param_groups:  # timm's layer-wise decay scales each group's lr
        group["lr"] = run.lr(run.step) * group.get("lr_scale", 1.0)
    total = torch.zeros((), device=run.device)
    for micro in range(cfg.grad_accum_steps):
        images, labels = _to(next(batches), run.device)
        images, targets = run.loss.targets(images, labels, recipe.mix_seed(cfg.seed, run.step, micro, run.world.rank))
        with _autocast(run.device, run.precision):
            loss = run.loss(run.forward(images).float(), targets)
        backward(recipe.accumulate_micro(loss, cfg.grad_accum_steps), run.scaler)
        total += loss.detach()
    run.world.average_gradients(run.trainable.values())
    if not optimizer_step(run.optimizer, run.trainable.values(), cfg.grad_clip, run.scaler):
        run.skipped_steps += 1
    if run.ema is not None:
        run.ema.update(run.model, step=run.step + 1)  # updates so far, as timm's train.py counts them
    run.step += 1
    return total / cfg.grad_accum_steps


def time_steps(
    configs: list[FinetuneConfig], device: str, steps: int = 5, budget_s: float = 4.0, decoded: InMemory | None = None
) -> dict[str, Any]:
    """How long runs of ``configs`` take here on ``device`` (the dry run's estimate): per run its setup, a first
    (warm-up) step, the median of up to ``steps`` more steps (``budget_s`` seconds at most) and an evaluation of the
    validation and test splits (a few batches, scaled to the split); also this machine's device and GPU count."""
    where = torch.device(device if device != "cuda" or torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(where) if where.type == "cuda" else "cpu"
    runs = [_time_run(cfg, where, steps, budget_s, decoded) for cfg in configs]
    return {"device": name, "gpus": torch.cuda.device_count(), "runs": runs}


def _time_run(cfg: FinetuneConfig, device: torch.device, steps: int, budget_s: float, decoded) -> dict[str, Any]:
    """``time_steps`` of one config."""
    entered = time.perf_counter()
    run = _prepare(cfg, device, decoded)
    setup_s = time.perf_counter() - entered
    batches = train_batches(run.splits.train, cfg.batch_size, seed=cfg.seed, num_workers=run.workers, device=device)
    times = []
    while len(times) < steps + 1 and (len(times) < 2 or sum(times[1:]) < budget_s):
        started = time.perf_counter()
        _train_step(run, batches).item()  # .item(): the step's kernels have finished
        times.append(time.perf_counter() - started)
    size = eval_batch_size(cfg.batch_size)
    evaluation = {}
    for split, dataset in (("val", run.splits.val), ("test", run.splits.test)):
        few = list(itertools.islice(eval_batches(dataset, size, run.workers, device), 3))
        started = time.perf_counter()
        evaluate(run.model, few, size, device, 0, run.forward, run.precision)
        evaluation[f"{split}_eval_s"] = (time.perf_counter() - started) / len(few) * math.ceil(len(dataset) / size)
    step_s = statistics.median(times[1:])
    return {
        "components": cfg.components,
        "precision": run.precision,
        "setup_s": setup_s + times[0] - step_s,  # the first step's one-time work counts as setup
        "step_s": step_s,
        "steps_timed": len(times) - 1,
        **evaluation,
    }


def _evaluate_run(run: _Run, val_batches, train_loss: float, count: int, started: float) -> dict[str, Any]:
    """Validate (and test the best weights after the last step); the metrics a report carries."""
    cfg, step = run.cfg, run.step
    evaluating = time.perf_counter()
    run.timing["time_in_steps_s"] += evaluating - started
    if not math.isfinite(train_loss):
        raise DivergedError(f"training loss became {train_loss} before step {step}", step)
    scored, forward = run.evaluated()
    val = evaluate(scored, val_batches, cfg.batch_size, run.device, run.workers, forward, run.precision, run.world)
    if val["acc"] > run.best["val_acc"]:
        kept = run.ema_tensors() or run.trainable
        run.best = {"val_acc": val["acc"], "step": step, "trainable": _snapshot(kept)}
    steps_per_s = count / (evaluating - started)
    metrics = {
        "step": step,
        "train_loss": train_loss,
        "val_acc": val["acc"],
        "val_loss": val["loss"],
        "best_val_acc": run.best["val_acc"],
        "best_step": run.best["step"],
        "current_lr": run.lr(step - 1),
        "trainable_params": run.trainable_params,
        "max_steps": cfg.max_steps,
        "steps_per_s": steps_per_s,
        "images_per_s": steps_per_s * cfg.batch_size * cfg.grad_accum_steps,  # throughput, the Pareto front's axis
        "amp_skipped_steps": run.skipped_steps,  # fp16: steps skipped for overflowed gradients (0 otherwise)
        "workers": run.world.size,  # data-parallel workers (vit.distributed)
        **device_facts(run.device),
        "precision": run.precision,
    }
    if step == cfg.max_steps and cfg.eval_test:
        metrics["test_acc"] = _test_best(run, cfg)
    run.timing["time_in_eval_s"] += time.perf_counter() - evaluating
    return {**metrics, **run.timing}


def create_run_model(cfg: FinetuneConfig, num_classes: int | None = None) -> nn.Module:
    """The model a run of ``cfg`` starts from: its pretrained weights (or, with ``pretrained`` off, an initialisation
    seeded by ``cfg.seed``) and a new head of ``num_classes`` (default: the dataset's) initialised from ``cfg.seed``."""
    torch.manual_seed(cfg.seed)
    if num_classes is None:
        num_classes = datasets.num_classes(cfg.dataset, data_dir=cfg.data_dir, download=cfg.download)
    return models.create_model(
        cfg.model, num_classes, pretrained=cfg.pretrained, weights=cfg.weights, drop_path_rate=cfg.drop_path
    )


def build_run(cfg: FinetuneConfig, decoded: InMemory | None = None) -> tuple[nn.Module, Splits]:
    """A run's model (``create_run_model``) and its seeded splits, as ``finetune`` trains them."""
    model = create_run_model(cfg)
    augment = transforms.with_auto_augment(datasets.resolve_augmentation(cfg.dataset, cfg.augment), cfg.auto_augment)
    splits = datasets.load_dataset(
        cfg.dataset,
        models.data_config(model),
        data_dir=cfg.data_dir,
        download=cfg.download,
        seed=cfg.seed,
        val_fraction=cfg.val_fraction,
        decoded=decoded,
        image_cache=cfg.image_cache,
        augment=augment,
    )
    return model, splits


def _test_best(run: _Run, cfg: FinetuneConfig) -> float:
    """Test accuracy of the best-validation weights (the model keeps them afterwards)."""
    _restore_best(run.trainable, run.best)
    test = evaluate(run.model, run.splits.test, cfg.batch_size, run.device, 0, run.forward, run.precision, run.world)
    return test["acc"]


def _restore_best(trainable: dict[str, nn.Parameter], best: dict[str, Any]) -> None:
    """Put the best-validation weights (when there are any) into the trainable parameters."""
    if best["trainable"] is not None:
        with torch.no_grad():
            for name, tensor in best["trainable"].items():
                trainable[name].copy_(tensor)


def _use_hardware(cfg: FinetuneConfig, device: torch.device) -> None:
    """CPU threads as the trial's CPUs; TF32 matmuls on CUDA with ``cuda_options`` (autocast is in the loop)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.cuda_options


def _num_workers(cfg: FinetuneConfig, splits: Splits) -> int:
    """DataLoader workers: none for in-memory data; by default one per trial CPU (at most 8) otherwise."""
    if _in_memory(splits):
        return 0
    return cfg.num_workers if cfg.num_workers >= 0 else min(max(cfg.threads, 1), 8)


def _in_memory(splits: Splits) -> bool:
    return all(isinstance(d, (SmallImages, TensorDataset)) for d in (splits.train, splits.val, splits.test))


def eval_batch_size(batch_size: int) -> int:
    """Evaluation batch size: the training batch size, at least 64 (no gradients, so memory allows it)."""
    return max(batch_size, 64)


@torch.inference_mode()
def _backbone_features(
    model: nn.Module, splits: Splits, device: torch.device, batch_size: int, precision: str
) -> Splits:
    """Each split passed once through the frozen backbone: the tokens before the final norm.

    Every split goes through the evaluation transform (the features of a linear probe are computed
    once, so training crops and flips do not apply). Token pooling needs only the prefix tokens
    (the family's ``head_tokens``); other pooling keeps every token.
    """
    model.eval()
    family = family_of(model)
    keep = family.head_tokens(model)

    def features(dataset: SmallImages) -> TensorDataset:
        evaluation = SmallImages(dataset.images, dataset.labels, dataset.indices, dataset.data_config, train=False)
        out, labels = [], []
        for x, y in eval_batches(evaluation, eval_batch_size(batch_size), device=device):
            labels.append(y.cpu())
            with _autocast(device, precision):
                tokens = family.features(model, x)
            out.append(
                (tokens[:, :keep] if keep else tokens).to(torch.float32, copy=True)
            )  # a copy: a view would keep every token
        return TensorDataset(torch.cat(out), torch.cat(labels))

    cached = Splits(features(splits.train), features(splits.val), features(splits.test), splits.num_classes)
    model.train()
    return cached


def _head_forward(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The trainable part of a linear probe: final norm, pooling and head, on cached tokens."""
    family = family_of(model)
    return lambda tokens: family.head(model, tokens)


def _snapshot(params: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in params.items()}


def _load_state(state: dict[str, Any], run: _Run) -> None:
    with torch.no_grad():
        for name, tensor in state["trainable"].items():
            run.trainable[name].copy_(tensor)
    run.optimizer.load_state_dict(state["optimizer"])
    if run.scaler is not None and "scaler" in state:
        run.scaler.load_state_dict(state["scaler"])
    if run.ema is not None:
        with torch.no_grad():
            for name, tensor in run.ema_tensors().items():  # a state without an EMA resumes it from the weights
                tensor.copy_(state.get("ema", state["trainable"])[name])
    run.step, run.best = int(state["step"]), state["best"]


def _to(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = batch
    return images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _autocast(device: torch.device, precision: str):
    """Autocast to ``precision``'s dtype (bf16, fp16; resolved on the device), or nothing for fp32."""
    return torch.autocast(device.type, dtype=_DTYPES.get(precision, torch.float32), enabled=precision in _DTYPES)
