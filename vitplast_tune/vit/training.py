"""One finetuning run: build, freeze, train with warm-up + cosine and clipping, evaluate, checkpoint.

``finetune(config)`` is a plain function with no Ray or MLflow in it; ``trial.py`` wraps it for
Ray Tune. It calls ``report(metrics, state)`` after every evaluation; ``state`` (only the
trainable tensors, the optimizer and the step; live, so save or copy it in the call) resumes the run
exactly where it stopped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from vitplast_tune import components
from vitplast_tune.config import FinetuneConfig  # re-exported: training.FinetuneConfig
from vitplast_tune.data import datasets
from vitplast_tune.data.batches import eval_batches, train_batches
from vitplast_tune.data.decoded import InMemory
from vitplast_tune.data.splits import SmallImages, Splits
from vitplast_tune.vit import methods, models


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite at ``step``."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


Report = Callable[[dict[str, Any], dict[str, Any]], None]


def warmup_cosine(step: int, total_steps: int, warmup_steps: int) -> float:
    """Learning-rate multiplier at ``step``: linear warm-up to 1, then cosine decay to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def default_device() -> torch.device:
    """CUDA when there is a GPU, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_optimizer(cfg: FinetuneConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """SGD with momentum or AdamW over the trainable parameters (fused kernels on CUDA with ``cuda_options``)."""
    fused = cfg.cuda_options and bool(params) and params[0].is_cuda
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, fused=fused or None
        )
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused or None)


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    dataset,
    batch_size: int,
    device: torch.device,
    num_workers: int = 0,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
    autocast: bool = True,
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` (or of ``forward``) over ``dataset`` (or its ``eval_batches``);
    bf16 on CUDA with ``autocast``."""
    forward = model if forward is None else forward  # not `or`: a compiled module has no truth value
    was_training = model.training
    model.eval()
    correct, loss_sum, count = torch.zeros((), device=device), torch.zeros((), device=device), 0
    batches = (
        eval_batches(dataset, eval_batch_size(batch_size), num_workers, device)
        if isinstance(dataset, Dataset)
        else dataset
    )
    for images, labels in batches:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with _autocast(device, autocast):
            logits = forward(images)
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum")
        correct += (logits.argmax(-1) == labels).sum()
        count += len(labels)
    model.train(was_training)
    return {"acc": correct.item() / max(count, 1), "loss": loss_sum.item() / max(count, 1)}


def finetune(
    cfg: FinetuneConfig,
    report: Report | None = None,
    resume: dict[str, Any] | None = None,
    device: torch.device | None = None,
    decoded: InMemory | None = None,
) -> dict[str, Any]:
    """Finetune ``cfg.components`` of ``cfg.model`` on ``cfg.dataset``; return the final metrics.

    After every ``eval_every`` steps (and the last), ``report(metrics, state)`` receives the
    metrics (step, train_loss, val_acc, val_loss, best_val_acc, current_lr, trainable_params, steps_per_s,
    images_per_s) and a resumable state of live tensors (save or copy it during the call: training goes on).
    When training ends, the best-validation weights are evaluated on the test
    split (``test_acc``), as in the paper. ``decoded`` is the dataset already decoded (shared by
    the search). Raises DivergedError on a NaN or infinite loss.

    Frozen parameters get no gradient and no optimizer state, and autograd stops below the lowest
    trainable component. A head-only run (the linear probe) on an in-memory dataset passes each
    image through the frozen backbone once and trains the head on the cached features.
    """
    cfg.validate()
    entered = time.perf_counter()
    run = _prepare(cfg, device or default_device(), decoded)
    if resume is not None:
        run.step, run.best = _load_state(resume, run.trainable, run.optimizer)
    splits, workers = run.splits, run.workers
    batches = train_batches(
        splits.train, cfg.batch_size, seed=cfg.seed, start_step=run.step, num_workers=workers, device=run.device
    )
    val_batches = eval_batches(splits.val, eval_batch_size(cfg.batch_size), workers, run.device)
    # Cumulative seconds since this call (a resumed run starts again at 0): setup (model, data, freezing,
    # feature cache), training steps (up to the loss sync at each evaluation), evaluation (val and test).
    run.timing.update(time_setup_s=time.perf_counter() - entered, time_in_steps_s=0.0, time_in_eval_s=0.0)
    metrics: dict[str, Any] = {}
    while run.step < cfg.max_steps:
        started = time.perf_counter()
        loss_sum, count = _train_until_evaluation(run, batches)
        metrics = _evaluate_run(run, val_batches, loss_sum.item() / count, count, started)
        if report is not None:
            report(metrics, run.state())
    return metrics


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
    step: int = 0
    best: dict[str, Any] = field(default_factory=lambda: {"val_acc": -1.0, "step": 0, "trainable": None})

    def lr(self, step: int) -> float:
        """The learning rate at ``step``: warm-up, then cosine decay."""
        return self.cfg.lr * warmup_cosine(step, self.cfg.max_steps, self.cfg.warmup)

    def state(self) -> dict[str, Any]:
        """What resumes the run: the live tensors, not copies (a copy of a ViT-B's weights and momentum is 0.7 GB),
        so the receiver saves or copies them before training goes on."""
        trainable = {n: p.detach() for n, p in self.trainable.items()}
        return {"step": self.step, "trainable": trainable, "optimizer": self.optimizer.state_dict(), "best": self.best}


def _prepare(cfg: FinetuneConfig, device: torch.device, decoded: InMemory | None) -> _Run:
    """Build the run: model and splits, frozen but for the subset, on ``device``, with its forward pass and optimizer."""
    _use_hardware(cfg, device)
    model, splits = build_run(cfg, decoded)
    counts = methods.apply_methods(model, cfg)  # LoRA adapters injected where asked, the rest frozen
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    model.set_grad_checkpointing(cfg.grad_checkpointing)
    model.to(device).train()
    forward: Callable[[torch.Tensor], torch.Tensor] = model
    feature_cache_s = 0.0
    if cfg.cache_features and not components.parse_subset(cfg.components) and _in_memory(splits):
        caching = time.perf_counter()
        splits = _backbone_features(model, splits, device, cfg.batch_size, cfg.cuda_options)
        forward, feature_cache_s = _head_forward(model), time.perf_counter() - caching
    elif cfg.compile:
        forward = torch.compile(model)
    optimizer = build_optimizer(cfg, list(trainable.values()))
    timing = {"time_feature_cache_s": feature_cache_s}
    workers = _num_workers(cfg, splits)
    return _Run(cfg, device, model, forward, splits, trainable, sum(counts.values()), optimizer, workers, timing)


def _train_until_evaluation(run: _Run, batches) -> tuple[torch.Tensor, int]:
    """Training steps up to the next evaluation (every ``eval_every`` steps and the last); the summed loss and count."""
    cfg, optimizer = run.cfg, run.optimizer
    loss_sum, count = torch.zeros((), device=run.device), 0
    while True:
        images, labels = _to(next(batches), run.device)
        for group in optimizer.param_groups:
            group["lr"] = run.lr(run.step)
        with _autocast(run.device, cfg.cuda_options):
            loss = F.cross_entropy(run.forward(images).float(), labels)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(run.trainable.values(), cfg.grad_clip)
        optimizer.step()
        # Freed now, not before the next backward: the forward pass's activations and an evaluation never
        # sit beside a whole set of stale gradients (a ViT-B's are 0.34 GB).
        optimizer.zero_grad(set_to_none=True)
        loss_sum += loss.detach()
        count += 1
        run.step += 1
        if run.step % cfg.eval_every == 0 or run.step == cfg.max_steps:
            return loss_sum, count


def _evaluate_run(run: _Run, val_batches, train_loss: float, count: int, started: float) -> dict[str, Any]:
    """Validate (and test the best weights after the last step); the metrics a report carries."""
    cfg, step = run.cfg, run.step
    evaluating = time.perf_counter()
    run.timing["time_in_steps_s"] += evaluating - started
    if not math.isfinite(train_loss):
        raise DivergedError(f"training loss became {train_loss} before step {step}", step)
    val = evaluate(run.model, val_batches, cfg.batch_size, run.device, run.workers, run.forward, cfg.cuda_options)
    if val["acc"] > run.best["val_acc"]:
        run.best = {"val_acc": val["acc"], "step": step, "trainable": _snapshot(run.trainable)}
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
        "images_per_s": steps_per_s * cfg.batch_size,  # training throughput, the Pareto front's axis
    }
    if step == cfg.max_steps and cfg.eval_test:
        metrics["test_acc"] = _test_best(
            run.model, run.trainable, run.best, run.splits.test, cfg, run.device, run.forward
        )
    run.timing["time_in_eval_s"] += time.perf_counter() - evaluating
    return {**metrics, **run.timing}


def build_run(cfg: FinetuneConfig, decoded: InMemory | None = None) -> tuple[nn.Module, Splits]:
    """A run's model (new head initialised from ``cfg.seed``) and its seeded splits, as ``finetune`` trains them."""
    torch.manual_seed(cfg.seed)
    num_classes = datasets.num_classes(cfg.dataset, data_dir=cfg.data_dir)
    model = models.create_model(cfg.model, num_classes, pretrained=cfg.pretrained, weights=cfg.weights)
    splits = datasets.load_dataset(
        cfg.dataset,
        models.data_config(model),
        data_dir=cfg.data_dir,
        download=cfg.download,
        seed=cfg.seed,
        val_fraction=cfg.val_fraction,
        decoded=decoded,
        image_cache=cfg.image_cache,
    )
    return model, splits


def _test_best(model, trainable, best, test_set, cfg, device, forward) -> float:
    """Test accuracy of the best-validation weights (the model keeps them afterwards)."""
    if best["trainable"] is not None:
        with torch.no_grad():
            for name, tensor in best["trainable"].items():
                trainable[name].copy_(tensor)
    return evaluate(model, test_set, cfg.batch_size, device, 0, forward, cfg.cuda_options)["acc"]


def _use_hardware(cfg: FinetuneConfig, device: torch.device) -> None:
    """CPU threads as the trial's CPUs; TF32 matmuls on CUDA with ``cuda_options`` (bf16 autocast is in the loop)."""
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
    model: nn.Module, splits: Splits, device: torch.device, batch_size: int, autocast: bool
) -> Splits:
    """Each split passed once through the frozen backbone: the tokens before the final norm.

    Every split goes through the evaluation transform (the features of a linear probe are computed
    once, so training crops and flips do not apply). Token pooling needs only the class token;
    other pooling keeps every token.
    """
    model.eval()
    keep = (
        1
        if getattr(model, "global_pool", "token") == "token" and getattr(model, "cls_token", None) is not None
        else None
    )

    def features(dataset: SmallImages) -> TensorDataset:
        evaluation = SmallImages(dataset.images, dataset.labels, dataset.indices, dataset.data_config, train=False)
        out, labels = [], []
        for x, y in eval_batches(evaluation, eval_batch_size(batch_size), device=device):
            labels.append(y.cpu())
            with _autocast(device, autocast):
                tokens = model.blocks(models.embed(model, x))
            out.append(
                (tokens[:, :keep] if keep else tokens).to(torch.float32, copy=True)
            )  # a copy: a view would keep every token
        return TensorDataset(torch.cat(out), torch.cat(labels))

    cached = Splits(features(splits.train), features(splits.val), features(splits.test), splits.num_classes)
    model.train()
    return cached


def _head_forward(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The trainable part of a linear probe: final norm, pooling and head, on cached tokens."""
    return lambda tokens: model.forward_head(model.norm(tokens))


def _snapshot(params: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in params.items()}


def _load_state(state: dict[str, Any], trainable: dict[str, nn.Parameter], optimizer) -> tuple[int, dict]:
    with torch.no_grad():
        for name, tensor in state["trainable"].items():
            trainable[name].copy_(tensor)
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"]), state["best"]


def _to(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = batch
    return images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def _autocast(device: torch.device, enabled: bool = True):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda")
