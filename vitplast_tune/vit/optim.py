"""Step a finetuning run: timm's optimizer, the warm-up and cosine schedule, backward, and the clipped step."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from vitplast_tune.config import FinetuneConfig


def warmup_cosine(step: int, total_steps: int, warmup_steps: int) -> float:
    """Return the learning-rate multiplier at ``step``: a linear warm-up to 1, then a cosine decay to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set each group's rate to ``lr`` times its ``lr_scale``, timm's layer-wise decay."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def build_optimizer(cfg: FinetuneConfig, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """Build timm's optimizer over the model's trainable parameters.

    "sgd" means classical momentum. Biases, norms and the model's ``no_weight_decay()`` tokens get no weight decay.
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
    """Run the backward pass of ``loss``, scaled by the gradient scaler under fp16."""
    (loss if scaler is None else scaler.scale(loss)).backward()


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    params: Iterable[nn.Parameter],
    *,
    grad_clip: float,
    scaler: torch.amp.GradScaler | None = None,
) -> bool:
    """Clip the gradients, step and free the gradients; return whether the optimizer stepped.

    Under fp16 the scaler unscales the gradients before clipping, and skips a step whose gradients overflowed.
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
        scaler.update()  # lowers the scale after a skipped step
        stepped = scaler.get_scale() >= scale
    # Free the gradients now, so that the next forward pass and evaluations never sit beside stale ones.
    optimizer.zero_grad(set_to_none=True)
    return stepped
