"""What steps a finetuning run: timm's optimizer over the trainable parameters, the warm-up + cosine learning-rate
schedule, the backward pass and the optimizer step with clipping (and, under fp16, the gradient scaler)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from vitplast_tune.config import FinetuneConfig


def warmup_cosine(step: int, total_steps: int, warmup_steps: int) -> float:
    """The learning-rate multiplier at ``step``: a linear warm-up to 1, then a cosine decay to 0.

    Args:
        step: the optimizer step (from 0).
        total_steps: the run's steps, where the cosine reaches 0.
        warmup_steps: the steps of the linear warm-up.

    Returns:
        The multiplier, in [0, 1].
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's learning rate to ``lr`` times the group's ``lr_scale`` (timm's layer-wise decay).

    Args:
        optimizer: the run's optimizer.
        lr: the scheduled learning rate of this step.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def build_optimizer(cfg: FinetuneConfig, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """timm's ``create_optimizer_v2`` over the model's trainable parameters.

    SGD with classical momentum or AdamW, no weight decay on biases, norms and the model's ``no_weight_decay()``
    tokens (position embedding, class token), layer-wise lr decay with ``layer_decay`` (each group's ``lr_scale``),
    fused kernels on CUDA with ``cuda_options``.

    Args:
        cfg: the run's settings (``optimizer``, ``lr``, ``weight_decay``, ``momentum``, ``layer_decay``).
        model: the model, its frozen parameters already without ``requires_grad``.
        device: where it trains.

    Returns:
        The optimizer.
    """
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


def backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None = None) -> None:
    """The backward pass of ``loss`` (scaled by the ``GradScaler`` under fp16), adding to the gradients.

    Args:
        loss: the loss to differentiate.
        scaler: the ``GradScaler`` under fp16, else None.
    """
    (loss if scaler is None else scaler.scale(loss)).backward()


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    params: Iterable[nn.Parameter],
    *,
    grad_clip: float,
    scaler: torch.amp.GradScaler | None = None,
) -> bool:
    """Clip the gradients at ``grad_clip`` (unscaled first under fp16) and step; free the gradients.

    With a ``GradScaler``, a step whose gradients overflowed is skipped and the scale lowered.

    Args:
        optimizer: the optimizer to step.
        params: the parameters whose gradients are clipped.
        grad_clip: the gradient norm's limit (0: none).
        scaler: the ``GradScaler`` under fp16, else None.

    Returns:
        Whether the optimizer stepped (the gradients are freed either way).
    """
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
    # sit beside a whole set of stale gradients.
    optimizer.zero_grad(set_to_none=True)
    return stepped
