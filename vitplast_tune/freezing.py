"""Freeze all but a subset of a model's components, and count what trains with or without the model."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from vitplast_tune.components import (
    BITFIT,
    BLOCK_COMPONENTS,
    COMPONENTS,
    FROZEN,
    FULL,
    HEAD,
    LORA,
    parse_methods,
)
from vitplast_tune.errors import UserError

if TYPE_CHECKING:  # the driver imports this module without torch
    from torch import nn

_LORA_PARAM = re.compile(r"\.lora_(A|B)\.")


@dataclass(frozen=True)
class Layout:
    """Say where a model family keeps each component, by parameter and module names.

    A name matches a parameter that it names or lies under as a module path; names a block lacks are skipped. ``emb``
    and ``head`` name model-level parameters (the head always trains). ``modules``, ``extras``, ``layer_scales`` and
    ``lora`` map each block component to the submodules that compute it, its other parameters, its layer-scale tensors
    and the linear layers LoRA adapts in it.
    """

    family: str
    blocks: str = "blocks"
    emb: tuple[str, ...] = ("patch_embed", "cls_token", "reg_token", "pos_embed", "norm_pre")
    head: tuple[str, ...] = ("head", "norm", "fc_norm", "attn_pool")
    modules: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: {
            "ln1": ("norm1",),
            "mha": ("attn",),
            "ln2": ("norm2",),
            "fc1": ("mlp.fc1", "mlp.fc1_g", "mlp.fc1_x"),
            "fc2": ("mlp.fc2",),
        }
    )
    extras: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: {"fc2": ("mlp.norm",)})
    layer_scales: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: {"mha": ("ls1",), "fc2": ("ls2",)})
    lora: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: {
            "mha": ("attn.qkv", "attn.proj"),
            "fc1": ("mlp.fc1", "mlp.fc1_g", "mlp.fc1_x"),
            "fc2": ("mlp.fc2",),
        }
    )

    def block_names(self, component: str) -> tuple[str, ...]:
        """List every name inside a block that belongs to a block component: modules, extras, layer scales."""
        return (*self.modules[component], *self.extras.get(component, ()), *self.layer_scales.get(component, ()))


def _under(name: str, prefixes: Iterable[str]) -> bool:
    """Tell whether ``name`` is one of ``prefixes`` or lies under one as a module path."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def parameter_component(name: str, layout: Layout) -> tuple[str, int | None]:
    """Return a parameter's component (or "head") and its block index (None for model-level parameters).

    Raises UserError where the layout does not place the parameter, so an unsupported model fails loudly.
    """
    if _under(name, layout.emb):
        return "emb", None
    if _under(name, layout.head):
        return HEAD, None
    match = _block_pattern(layout.blocks).match(name)
    if match:
        block, rest = int(match.group(1)), match.group(2)
        for component in BLOCK_COMPONENTS:
            if _under(rest, layout.block_names(component)):
                return component, block
    raise UserError(
        f'parameter "{name}" belongs to no component of the {layout.family} family\'s layout; the model is not one '
        "this family supports (vit/families/ declares the supported ones)"
    )


@cache
def _block_pattern(blocks: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(blocks)}\.(\d+)\.(.+)$")


def num_blocks(model: nn.Module, layout: Layout) -> int:
    """Count a model's blocks."""
    return len(model.get_submodule(layout.blocks))


def count_parameters(model: nn.Module, *, layout: Layout) -> dict[str, int]:
    """Count a model's parameters per component, in canonical order, "head" last."""
    counts = {c: 0 for c in (*COMPONENTS, HEAD)}
    for name, p in model.named_parameters():
        counts[parameter_component(name, layout)[0]] += p.numel()
    return counts


def freeze(
    model: nn.Module,
    subset: str | Iterable[str] | Mapping[str, str],
    blocks: Sequence[int] | range | None = None,
    *,
    layout: Layout,
) -> dict[str, int]:
    """Train only the subset's components by their methods, and the head; freeze the rest.

    LoRA adapters must be in the model already: ``vit.methods.apply_methods`` injects them. ``blocks`` None trains the
    block components in every block. Returns the trainable parameter count of each component and "head"; raises
    UserError when blocks are out of range, the layout misses a parameter, or LoRA has no adapters.
    """
    methods = parse_methods(subset)
    allowed_blocks = None if blocks is None else set(blocks)
    depth = num_blocks(model, layout)
    if allowed_blocks is not None and any(not 0 <= b < depth for b in allowed_blocks):
        raise UserError(f"blocks {sorted(allowed_blocks)} out of range: the model has {depth}")
    trainable = {c: 0 for c in (*COMPONENTS, HEAD)}
    for name, p in model.named_parameters():
        component, block = parameter_component(name, layout)
        method = FULL if component == HEAD else methods.get(component, FROZEN)
        in_scope = block is None or allowed_blocks is None or block in allowed_blocks
        train = in_scope and trains(name, method)
        p.requires_grad_(train)
        if train:
            trainable[component] += p.numel()
    missing = [c for c, m in methods.items() if m == LORA and not trainable[c]]
    if missing:
        raise UserError(
            f"{', '.join(missing)} should train by LoRA but the model has no adapters there: build it with "
            "vit.methods.apply_methods, which injects them"
        )
    return trainable


def trains(name: str, method: str) -> bool:
    """Tell whether a parameter trains under its component's method."""
    adapter = is_adapter(name)
    if method == FULL:
        return not adapter
    if method == BITFIT:
        return is_bias(name) and not adapter
    return method == LORA and adapter


def is_bias(name: str) -> bool:
    """Tell whether a parameter is a bias (``*.bias``, ``q_bias``, ``v_bias``), which BitFit trains."""
    last = name.rsplit(".", 1)[-1]
    return last == "bias" or last.endswith("_bias")


def is_adapter(name: str) -> bool:
    """Tell whether a parameter belongs to a LoRA adapter."""
    return _LORA_PARAM.search(name) is not None


def lora_layers(model: nn.Module, component: str, block: int, layout: Layout) -> list[str]:
    """List the full names of a block's layers that LoRA adapts in a component, in the layout's order."""
    names = [f"{layout.blocks}.{block}.{rel}" for rel in layout.lora.get(component, ())]
    return [name for name in names if _has_module(model, name)]


def _has_module(model: nn.Module, name: str) -> bool:
    try:
        return model.get_submodule(name) is not None
    except AttributeError:
        return False


def parameter_summary(model: nn.Module, *, layout: Layout) -> list[dict[str, Any]]:
    """Summarize a model's parameters per component and block (``params``, ``bias``, ``lora_width``) for
    ``count_trainable``.
    """
    rows: dict[tuple[str, int | None], dict[str, Any]] = {}
    for name, p in model.named_parameters():
        if is_adapter(name):
            continue
        component, block = parameter_component(name, layout)
        row = rows.setdefault((component, block), {"component": component, "block": block, "params": 0, "bias": 0})
        row["params"] += p.numel()
        row["bias"] += p.numel() if is_bias(name) else 0
    for (component, block), row in rows.items():
        layers = (
            [model.get_submodule(n) for n in lora_layers(model, component, block, layout)] if block is not None else []
        )
        row["lora_width"] = sum(m.in_features + m.out_features for m in layers)
    return list(rows.values())


def count_trainable(
    summary: list[dict[str, Any]],
    subset: str | Iterable[str] | Mapping[str, str],
    blocks: Sequence[int] | None = None,
    lora_rank: int = 8,
) -> dict[str, int]:
    """Count what ``freeze`` would return for a subset from a ``parameter_summary``, without the model."""
    methods = parse_methods(subset)
    per_method = {FULL: lambda r: r["params"], BITFIT: lambda r: r["bias"], LORA: lambda r: lora_rank * r["lora_width"]}
    counts = {c: 0 for c in (*COMPONENTS, HEAD)}
    for row in summary:
        component, block = row["component"], row["block"]
        method = FULL if component == HEAD else methods.get(component, FROZEN)
        if method != FROZEN and (block is None or blocks is None or block in blocks):
            counts[component] += per_method[method](row)
    return counts
