"""Gradient criteria of which components to finetune, measured at the pretrained weights before any training.

Two predictors per component and per layer, from the gradient of the downstream cross-entropy on a few
training batches (the new head initialised as in training; every parameter receives a gradient):

    grad_norm  ||g||                 the plain gradient norm
    rgn        ||g|| / ||theta||     the relative gradient norm of Auto-RGN (Lee et al., ICLR 2023,
                                     "Surgical Fine-Tuning"), which scores tensors by how much a step
                                     would move them relative to their size

``g`` is the gradient of the mean loss over the batches. The component -> parameter mapping is
``components.parameter_component``; nothing here needs Ray or MLflow.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from vitplast_tune.components import COMPONENTS, HEAD, parameter_component
from vitplast_tune.errors import UserError

_EMB_LAYER = -1  # the embedding's row in the per-layer table, as in plasticity tables


def gradient_table(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *, device: str | torch.device = "cpu"
) -> pd.DataFrame:
    """Per (component, layer): squared norms of the mean-loss gradient and of the weights, grad_norm and rgn.

    Columns component, layer (-1 for emb), grad_sq, weight_sq, params, grad_norm, rgn; the head is left out.
    The model is restored to its training mode and device; its parameters are not changed.
    """
    modes = {m: m.training for m in model.modules()}
    flags = {p: p.requires_grad for p in model.parameters()}
    home = next(model.parameters()).device
    model.to(device).eval()  # no dropout: the gradient at the pretrained weights, deterministic
    try:
        grads = _mean_gradient(model, batches, torch.device(device))
        rows = _component_rows(model, grads)
    finally:
        model.to(home)
        for module, training in modes.items():
            module.training = training
        for p, flag in flags.items():
            p.requires_grad_(flag)
    return _table(rows)


def _mean_gradient(model: nn.Module, batches, device: torch.device) -> dict[str, torch.Tensor]:
    """The gradient of the mean cross-entropy over all batches (each batch weighted by its size), by name."""
    params = dict(model.named_parameters())
    for p in params.values():
        p.requires_grad_(True)
    sums = {name: torch.zeros_like(p, dtype=torch.float64) for name, p in params.items()}
    count = 0
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        loss = F.cross_entropy(model(images).float(), labels, reduction="sum")
        for name, grad in zip(params, torch.autograd.grad(loss, list(params.values()), allow_unused=True)):
            if grad is not None:
                sums[name] += grad.double()
        count += len(labels)
    if count == 0:
        raise UserError("gradient criteria need at least one batch of training images")
    return {name: total / count for name, total in sums.items()}


def _component_rows(model: nn.Module, grads: dict[str, torch.Tensor]) -> dict[tuple[str, int], list[float]]:
    rows: dict[tuple[str, int], list[float]] = {}
    for name, p in model.named_parameters():
        component, block = parameter_component(name)
        if component == HEAD:
            continue
        row = rows.setdefault((component, _EMB_LAYER if block is None else block), [0.0, 0.0, 0])
        row[0] += float(grads[name].pow(2).sum())
        row[1] += float(p.detach().double().pow(2).sum())
        row[2] += p.numel()
    return rows


def _table(rows: dict[tuple[str, int], list[float]]) -> pd.DataFrame:
    order = sorted(rows, key=lambda key: (key[1] >= 0, key[1], COMPONENTS.index(key[0])))
    table = pd.DataFrame(
        [(c, layer, *rows[c, layer]) for c, layer in order],
        columns=["component", "layer", "grad_sq", "weight_sq", "params"],
    )
    table["grad_norm"] = np.sqrt(table["grad_sq"])
    table["rgn"] = table["grad_norm"] / np.sqrt(table["weight_sq"]).replace(0.0, np.nan)
    return table
