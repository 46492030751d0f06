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

import math
from typing import Iterable

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from vitplast_tune.components import COMPONENTS, HEAD, parameter_component, parse_subset
from vitplast_tune.errors import UserError

CRITERIA: tuple[str, ...] = ("grad_norm", "rgn", "rgn_mean")
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


def aggregate_criteria(table: pd.DataFrame) -> pd.DataFrame:
    """Per component: grad_norm and rgn over all its layers together, and rgn_mean, the mean of rgn over layers."""
    grouped = table.groupby("component", sort=False)
    out = pd.DataFrame(
        {
            "grad_sq": grouped["grad_sq"].sum(),
            "weight_sq": grouped["weight_sq"].sum(),
            "params": grouped["params"].sum(),
            "rgn_mean": grouped["rgn"].mean(),
        }
    )
    out = out.reindex([c for c in COMPONENTS if c in out.index])
    out["grad_norm"] = np.sqrt(out["grad_sq"])
    out["rgn"] = out["grad_norm"] / np.sqrt(out["weight_sq"]).replace(0.0, np.nan)
    return out.rename_axis("component").reset_index()


def subset_criteria(table: pd.DataFrame, subset: str | Iterable[str]) -> dict[str, float]:
    """Criterion scores of a subset (like ``plasticity.subset_scores``): norms of its whole parameter vector.

    grad_norm = ||g_S||, rgn = ||g_S|| / ||theta_S|| over every parameter of the subset, rgn_mean = mean of the
    components' per-layer mean rgn. ``table`` is a ``gradient_table``; the head-only subset gives NaN.
    """
    names = parse_subset(subset)
    if not names:
        return dict.fromkeys(CRITERIA, math.nan)
    per = aggregate_criteria(table).set_index("component")
    missing = [c for c in names if c not in per.index]
    if missing:
        raise UserError(f"the gradient table has no rows for {', '.join(missing)}")
    rows = per.loc[list(names)]
    grad, weight = math.sqrt(rows["grad_sq"].sum()), math.sqrt(rows["weight_sq"].sum())
    return {
        "grad_norm": grad,
        "rgn": grad / weight if weight > 0 else math.nan,
        "rgn_mean": float(rows["rgn_mean"].mean()),
    }


def measure(cfg, *, num_batches: int = 4, decoded=None, device: str | torch.device = "cpu") -> pd.DataFrame:
    """The ``gradient_table`` of a run's pretrained model on ``num_batches`` of its training batches.

    ``cfg`` is a ``training.FinetuneConfig`` (model, weights, dataset, batch size, seed); the head is
    initialised with ``cfg.seed`` as a trial's would be. ``decoded`` is an already decoded dataset.
    """
    from vitplast_tune import data, models

    if num_batches < 1:
        raise UserError(f"num_batches must be a positive integer, not {num_batches}")
    torch.manual_seed(cfg.seed)
    model = models.build_model(cfg.model, data.num_classes(cfg.dataset, data_dir=cfg.data_dir),
                               pretrained=cfg.pretrained, weights=cfg.weights)  # fmt: skip
    splits = data.load_dataset(cfg.dataset, models.data_config(model), data_dir=cfg.data_dir, download=cfg.download,
                               seed=cfg.seed, val_fraction=cfg.val_fraction, decoded=decoded)  # fmt: skip
    stream = data.train_batches(splits.train, cfg.batch_size, seed=cfg.seed)
    batches = [next(stream) for _ in range(num_batches)]
    table = gradient_table(model, batches, device=device)
    table.attrs.update(model=cfg.model, dataset=cfg.dataset, num_batches=num_batches, batch_size=cfg.batch_size)
    return table


def lab_predictors(settings: dict, subsets: Iterable[str], *, num_batches: int = 4, plasticity_pairs: int | None = None,
                   reference: str = "fractals") -> pd.DataFrame:  # fmt: skip
    """Per subset (index): gradient criteria (grad_norm, rgn, rgn_mean) and in-network plasticity (in_network_mean).

    ``settings`` are a search's settings (a FinetuneConfig as a dict); the in-network plasticity report is
    measured once and cached like the search's paper-variant one.
    """
    from vitplast_tune import plasticity
    from vitplast_tune.training import FinetuneConfig

    cfg = FinetuneConfig.from_dict(settings)
    table = measure(cfg, num_batches=num_batches)
    report = plasticity.plasticity_report(
        cfg.model, weights=cfg.weights, pretrained=cfg.pretrained, dataset=cfg.dataset, reference=reference,
        data_dir=cfg.data_dir, download=cfg.download, variant="in_network", max_pairs=plasticity_pairs, reuse=True,
    )  # fmt: skip
    rows = {}
    for subset in subsets:
        scores = plasticity.subset_scores(report.table, subset, report.meta["component_params"])
        rows[subset] = {**subset_criteria(table, subset), "in_network_mean": scores["plasticity_mean"]}
    return pd.DataFrame.from_dict(rows, orient="index")
