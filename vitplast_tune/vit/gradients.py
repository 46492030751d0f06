"""The gradients the gradient criteria read, measured at the pretrained weights before any training.

Per component and layer, sums from the gradient of the downstream cross-entropy on a few training batches (the new
head initialised as in training; every parameter receives a gradient), from which the criteria of kind ``gradients``
(``predictors.scores``) are computed for a layer, a component or a subset; those registered today:

    grad_norm        ||g||                  the plain norm of the mean-loss gradient over all the batches
    grad_norm_ratio  ||g|| / ||theta||      the same over the weight norm, every tensor of the component and
                                            layer merged into one vector (so a bias or a LayerNorm weighs
                                            almost nothing beside a weight matrix); not Auto-RGN
    auto_rgn         mean_t mean_b ||g_t,b|| / ||theta_t||
                                            Auto-RGN (Lee et al., ICLR 2023, "Surgical Fine-Tuning"): per
                                            parameter tensor t, the gradient norm of batch b's mean loss over
                                            the tensor's norm, averaged over the batches; a component's (or a
                                            layer's) score is the mean over its tensors, each tensor counting once

The order of Auto-RGN's averages follows the authors' code (github.com/anniesch/surgical-finetuning,
``main.py``, ``get_lr_weights``): for each of the first 5 training batches, ``F.cross_entropy`` (the batch
mean), ``torch.autograd.grad`` and ``torch.norm(grad) / torch.norm(param)`` per named parameter; then
``np.array(v).mean(0)`` per parameter over the batches. Their code leaves BatchNorm out (its ResNets'
``bn`` tensors); a ViT's LayerNorms are components here and keep their tensors. The model is measured in
eval mode (no dropout, deterministic); the testbed has no dropout, so train mode would give the same.

The component -> parameter mapping is ``freezing.parameter_component`` with the model family's layout; nothing here
needs Ray or MLflow.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from vitplast_tune.components import COMPONENTS, HEAD
from vitplast_tune.errors import UserError
from vitplast_tune.freezing import parameter_component
from vitplast_tune.vit.families.registry import layout_of

_EMB_LAYER = -1  # the embedding's row in the per-layer table, as in plasticity tables
COLUMNS = ["component", "layer", "tensors", "params", "grad_sq", "weight_sq", "rgn_sum"]


def gradient_table(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *, device: str | torch.device = "cpu"
) -> pd.DataFrame:
    """Measure what the gradient criteria are made of, per component and layer.

    The model is restored to its training mode, device and ``requires_grad`` flags; its parameters are not changed.

    Args:
        model: The model.
        batches: The (images, labels) batches the mean loss is taken over.
        device: Where to compute.

    Returns:
        One row per (component, layer), the head left out, with columns component, layer (-1 for emb), tensors
        (those with a non-zero norm, which Auto-RGN averages), params, grad_sq and weight_sq (squared norms of the
        mean-loss gradient and of the weights) and rgn_sum (the sum of the tensors' Auto-RGN ratios).
    """
    modes = {m: m.training for m in model.modules()}
    flags = {p: p.requires_grad for p in model.parameters()}
    home = next(model.parameters()).device
    model.to(device).eval()  # no dropout: the gradient at the pretrained weights, deterministic
    try:
        mean_grad, ratios = _per_tensor(model, batches, torch.device(device))
        rows = _component_rows(model, mean_grad, ratios)
    finally:
        model.to(home)
        for module, training in modes.items():
            module.training = training
        for p, flag in flags.items():
            p.requires_grad_(flag)
    return _table(rows)


def _per_tensor(model: nn.Module, batches, device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """By parameter name: the gradient of the mean loss over every image (each batch weighted by its size), and
    Auto-RGN's ratio ||g_t,b|| / ||theta_t|| of each batch's mean loss, averaged over the batches (NaN for a
    tensor whose norm is 0)."""
    params = dict(model.named_parameters())
    for p in params.values():
        p.requires_grad_(True)
    sums = {name: torch.zeros_like(p, dtype=torch.float64) for name, p in params.items()}
    norms = {name: float(p.detach().double().norm()) for name, p in params.items()}
    ratio_sums = dict.fromkeys(params, 0.0)
    count, n_batches = 0, 0
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        logits = model(images)
        loss = F.cross_entropy(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits, labels)
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for name, grad in zip(params, grads):
            grad = torch.zeros_like(sums[name]) if grad is None else grad.double()
            sums[name] += grad * len(labels)
            ratio_sums[name] += float(grad.norm()) / norms[name] if norms[name] > 0 else float("nan")
        count, n_batches = count + len(labels), n_batches + 1
    if count == 0:
        raise UserError("gradient criteria need at least one batch of training images")
    return {name: total / count for name, total in sums.items()}, {n: s / n_batches for n, s in ratio_sums.items()}


def _component_rows(
    model: nn.Module, grads: dict[str, torch.Tensor], ratios: dict[str, float]
) -> dict[tuple[str, int], list[float]]:
    """Per (component, layer): [tensors, params, grad_sq, weight_sq, sum of the tensors' Auto-RGN ratios]."""
    rows: dict[tuple[str, int], list[float]] = {}
    layout = layout_of(model)
    for name, p in model.named_parameters():
        component, block = parameter_component(name, layout)
        if component == HEAD:
            continue
        row = rows.setdefault((component, _EMB_LAYER if block is None else block), [0, 0, 0.0, 0.0, 0.0])
        if np.isfinite(ratios[name]):
            row[0] += 1
            row[4] += ratios[name]
        row[1] += p.numel()
        row[2] += float(grads[name].pow(2).sum())
        row[3] += float(p.detach().double().pow(2).sum())
    return rows


def _table(rows: dict[tuple[str, int], list[float]]) -> pd.DataFrame:
    order = sorted(rows, key=lambda key: (key[1] >= 0, key[1], COMPONENTS.index(key[0])))
    return pd.DataFrame([(c, layer, *rows[c, layer]) for c, layer in order], columns=COLUMNS)
