"""Measure the plasticity of ViT components: the mean rate of change ||f(x) - f(y)|| / ||x - y|| over image pairs.

The ``paper`` variant applies every component to the embedding output; ``in_network`` feeds each its real input.
docs/concepts/plasticity.md defines both, and the ``emb`` row this project adds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from vitplast_tune.components import BLOCK_COMPONENTS
from vitplast_tune.config import check_variant
from vitplast_tune.errors import UserError
from vitplast_tune.type_checks import checked
from vitplast_tune.vit.devices import resolve_device
from vitplast_tune.vit.families.base import Family, first_tensor
from vitplast_tune.vit.families.registry import family_of

Images = Tensor | Iterable[Any]  # (N, C, H, W), or batches of it (or of (images, labels) tuples)


@checked(batch_size=1, max_pairs=1)
def compute_plasticity(
    model: nn.Module,
    reference: Images,
    downstream: Images,
    *,
    variant: str = "paper",
    batch_size: int = 64,
    device: str | torch.device | None = None,
    max_pairs: int | None = None,
) -> pd.DataFrame:
    """Measure the plasticity of every component of every block over the pairs (reference[i], downstream[i]).

    Args:
        model: A model of a supported family.
        reference: Reference images, (N, C, H, W) normalised for the model, or batches of them or of (images, labels).
        downstream: Downstream images, alike.
        variant: "paper" (the paper's definition) or "in_network".
        batch_size: Pairs per forward pass.
        device: Where to measure (None: CUDA when there is a GPU, else the CPU).
        max_pairs: At most this many pairs (None: every pair).

    Returns:
        One row per component and layer, with columns component, layer, plasticity, std, sem and n_pairs: the ``emb``
        row first, then ln1, mha, ln2, fc1 and fc2 by layer. ``attrs["variant"]`` names the variant.

    Raises:
        UserError: A setting is invalid, the model is of no supported family, or there are no pairs to measure.
    """
    _check_settings(variant, batch_size, max_pairs)
    family = family_of(model)
    blocks = family.check(model)
    device = resolve_device(device)
    first = next(model.parameters())
    home, dtype = first.device, first.dtype
    acc_dtype = torch.float32 if device.type == "mps" else torch.float64
    num_rows = 1 + len(BLOCK_COMPONENTS) * len(blocks)
    sums = torch.zeros(3, num_rows, dtype=acc_dtype, device=device)  # sum, sum of squares, count
    modes = {m: m.training for m in model.modules()}
    model.eval().to(device)
    try:
        with torch.inference_mode():
            ratios_of = _paper_ratios if variant == "paper" else _in_network_ratios
            for x, y in _pairs(reference, downstream, batch_size, max_pairs):
                pixels = torch.cat([x, y]).to(device=device, dtype=dtype, non_blocking=True)
                num, den = ratios_of(family, model, blocks, pixels)
                _accumulate(sums, num, den)
            totals = sums.cpu().numpy()  # the one sync with the device
    finally:
        model.to(home)
        for module, training in modes.items():
            module.training = training

    if totals[2].max() == 0:
        raise UserError(
            "no image pairs to measure: the reference or downstream images are empty, "
            "or every pair is identical (the same images on both sides)"
        )
    return _table(totals, len(blocks), variant)


# ----------------------------------------------------------------------------- internals


def _check_settings(variant: str, batch_size: int, max_pairs: int | None) -> None:
    check_variant(variant)
    if batch_size < 1:
        raise UserError(f"batch_size must be a positive integer, not {batch_size}")
    if max_pairs is not None and max_pairs < 1:
        raise UserError(f"max_pairs must be a positive integer, not {max_pairs}")


def _pair_dist(stacked: Tensor) -> Tensor:
    """Return each pair's Frobenius distance between the two halves of a stacked batch."""
    a, b = stacked.chunk(2)
    dtype = torch.float64 if stacked.dtype == torch.float64 else torch.float32
    return torch.linalg.vector_norm((a - b).flatten(1), dim=1, dtype=dtype)


def _paper_ratios(family: Family, model: nn.Module, blocks: list[nn.Module], pixels: Tensor) -> tuple[Tensor, Tensor]:
    """Return the numerators and denominators (rows x pairs) of every component on the embedding output."""
    embedded = family.embed(model, pixels)
    e = embedded.tokens
    e_dist = _pair_dist(e)
    per_block = []
    for i, block in enumerate(blocks):
        modules = family.component_modules(block)
        outputs = [family.apply(c, modules[c], e, embedded.kwargs(i)) for c in BLOCK_COMPONENTS]
        per_block.append([_pair_dist(out) for out in outputs])
    num = torch.stack([e_dist] + [dists[c] for c in range(len(BLOCK_COMPONENTS)) for dists in per_block])
    den = torch.cat([_pair_dist(pixels)[None], e_dist.expand(num.shape[0] - 1, -1)])
    return num, den


def _in_network_ratios(
    family: Family, model: nn.Module, blocks: list[nn.Module], pixels: Tensor
) -> tuple[Tensor, Tensor]:
    """Return the numerators and denominators (rows x pairs) of every component on its real input."""
    captured: dict[tuple[int, str], list[tuple[Tensor, Tensor]]] = {}

    def hook_for(key):
        def hook(module, args, output):
            captured.setdefault(key, []).append((_pair_dist(first_tensor(output)), _pair_dist(args[0])))

        return hook

    handles = [
        module.register_forward_hook(hook_for((i, name)))
        for i, block in enumerate(blocks)
        for name, modules in family.component_modules(block).items()
        for module in modules
    ]
    try:
        embedded = family.embed(model, pixels)
        family.run_blocks(model, embedded)
    finally:
        for handle in handles:
            handle.remove()
    keys = [(i, name) for name in BLOCK_COMPONENTS for i in range(len(blocks))]
    missing = [k for k in keys if k not in captured]
    if missing:
        block, name = missing[0]
        raise UserError(f"the forward pass never called {name} of block {block}: unsupported block layout")
    outputs = [torch.stack([d for d, _ in captured[k]]).square().sum(0).sqrt() for k in keys]
    num = torch.stack([_pair_dist(embedded.tokens)] + outputs)
    den = torch.stack([_pair_dist(pixels)] + [captured[k][0][1] for k in keys])
    return num, den


def _accumulate(sums: Tensor, num: Tensor, den: Tensor) -> None:
    """Add the pairs' ratios to the running sums, squared sums and counts, on the device."""
    num, den = num.to(sums.dtype), den.to(sums.dtype)
    valid = den > 0
    ratio = torch.where(valid, num / torch.where(valid, den, 1.0), 0.0)
    sums[0] += ratio.sum(1)
    sums[1] += ratio.square().sum(1)
    sums[2] += valid.sum(1)


def _table(totals: np.ndarray, depth: int, variant: str) -> pd.DataFrame:
    """Build the result table from the totals: ``emb`` first, then component by component."""
    total, total_sq, n = totals
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / n
        var = np.clip(total_sq - n * mean**2, 0.0, None) / (n - 1)
        std = np.where(n > 1, np.sqrt(var), np.nan)
        sem = std / np.sqrt(n)
    rows = [("emb", 0)] + [(c, i) for c in BLOCK_COMPONENTS for i in range(depth)]
    table = pd.DataFrame(rows, columns=["component", "layer"])
    table["plasticity"], table["std"], table["sem"], table["n_pairs"] = mean, std, sem, n.astype(int)
    table.attrs["variant"] = variant
    return table


def _pairs(
    reference: Images, downstream: Images, batch_size: int, max_pairs: int | None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield aligned batches, pair i being reference[i] and downstream[i], up to the shorter side or ``max_pairs``."""
    seen = 0
    for x, y in zip(_batches(reference, batch_size, "reference"), _batches(downstream, batch_size, "downstream")):
        n = min(len(x), len(y), (max_pairs - seen) if max_pairs is not None else len(x))
        if n <= 0:
            return
        if x.shape[1:] != y.shape[1:]:
            raise UserError(
                f"reference images {tuple(x.shape[1:])} and downstream images {tuple(y.shape[1:])} differ in shape"
            )
        yield x[:n], y[:n]
        seen += n


def _batches(source: Images, batch_size: int, what: str) -> Iterator[Tensor]:
    """Re-cut a tensor, or an iterable of batches, into batches of ``batch_size``."""
    if isinstance(source, Tensor):
        _check_images(source, what)
        yield from source.split(batch_size)
        return
    buffer: list[Tensor] = []
    held = 0
    for item in source:
        images = item[0] if isinstance(item, (tuple, list)) else item
        _check_images(images, what)
        buffer.append(images)
        held += len(images)
        while held >= batch_size:
            joined = torch.cat(buffer) if len(buffer) > 1 else buffer[0]
            yield joined[:batch_size]
            rest = joined[batch_size:]
            buffer, held = ([rest] if len(rest) else []), len(rest)
    if held:
        yield torch.cat(buffer)


def _check_images(images: Any, what: str) -> None:
    if not isinstance(images, Tensor) or images.ndim != 4:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise UserError(f"{what} images must be a (N, C, H, W) tensor or batches of them, not {shape}")
