"""The six finetunable components of a Vision Transformer, and freezing all but a subset.

A component is a named group of parameters (the paper's components, Odonnat et al., ICML 2026); in timm's
VisionTransformer:

    emb  patch_embed, cls/register tokens, pos_embed (model level)
    ln1  blocks[i].norm1           mha  blocks[i].attn (+ layer scale ls1)
    ln2  blocks[i].norm2           fc1  blocks[i].mlp.fc1
                                   fc2  blocks[i].mlp.fc2 (+ mlp.norm, layer scale ls2)

Other model families keep them under other names; a ``Layout`` says where (``vit/families/`` declares one per family,
and ``vit.families.registry.layout_of(model)`` finds a model's). The classification head and the final norm ("head")
always train. A subset is written as a tuple of names in the canonical order above, or as a string:
"mha+fc1", "all" (full finetuning) or "head" (the linear probe: no component).

How a component trains is its *method* (``METHODS``): ``full`` (every parameter, the default), ``lora`` (low-rank
adapters on its linear layers: mha's projections, fc1, fc2, as the layout's ``lora`` names them; injected with peft by
``vit/methods.py``), ``bitfit`` (its biases only) or ``frozen``. A subset names a method after a colon, "full" left
out: "mha:lora+fc1" trains mha's LoRA adapters and fc1 in full; "all:bitfit" every bias. ``depth`` says in which
blocks the block components train: "all", "first", "middle" or "last" (thirds), or a contiguous range "i-j" of block
indices.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from vitplast_tune.errors import UserError, did_you_mean

if TYPE_CHECKING:  # torch only in annotations: the driver of a search imports this without torch
    from torch import nn

COMPONENTS: tuple[str, ...] = ("emb", "ln1", "mha", "ln2", "fc1", "fc2")
BLOCK_COMPONENTS: tuple[str, ...] = COMPONENTS[1:]
HEAD = "head"
ALL = "all"
# The paper's order of single components (by plasticity), then the embedding, full finetuning, linear probe.
TABLE_ORDER: tuple[str, ...] = ("mha", "fc1", "fc2", "ln2", "ln1", "emb", ALL, HEAD)


@dataclass(frozen=True)
class Layout:
    """Where a model family keeps each component, by parameter and module names (plain names, no torch).

    A name matches a parameter when it is the parameter's name or a module path above it (``"norm1"`` matches
    ``norm1.weight``, not ``norm10.weight``). ``blocks`` is the module path of the block list; ``emb`` and ``head``
    name model-level parameters; per block component, ``modules`` names the submodules of a block that compute it (the
    first one present, or several whose outputs join: a gated MLP's ``fc1_g`` and ``fc1_x``), ``extras`` other
    parameters it owns (an MLP's inner norm), ``layer_scales`` its layer-scale tensors, and ``lora`` the linear layers
    LoRA adapts in it (those present). Names that a block does not have are skipped: one layout covers a family's
    variants.
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
        """Every name inside a block that belongs to a block component (modules, extras, layer scales)."""
        return (*self.modules[component], *self.extras.get(component, ()), *self.layer_scales.get(component, ()))


def _under(name: str, prefixes: Iterable[str]) -> bool:
    """Whether ``name`` is one of ``prefixes`` or lies under one as a module path."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


FULL, FROZEN, LORA, BITFIT = "full", "frozen", "lora", "bitfit"
METHODS: tuple[str, ...] = (FROZEN, FULL, LORA, BITFIT)
LORA_COMPONENTS: tuple[str, ...] = ("mha", "fc1", "fc2")  # the components made of linear layers, which LoRA adapts
ALLOWED_METHODS: dict[str, tuple[str, ...]] = {
    c: (FROZEN, FULL, LORA, BITFIT) if c in LORA_COMPONENTS else (FROZEN, FULL, BITFIT) for c in COMPONENTS
}
_LORA_PARAM = re.compile(r"\.lora_(A|B)\.")
DEPTHS: tuple[str, ...] = ("all", "first", "middle", "last")  # thirds of the blocks; or a range "i-j"
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_methods(subset: str | Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    """The method of each component that trains, in canonical order: "mha:lora+fc1" -> {"mha": "lora", "fc1": "full"}.

    Also takes a list of names ("mha:lora" items allowed), "all" / "all:bitfit", "head", or a mapping of
    component to method (frozen ones left out). Raises UserError for an unknown name or a method a component
    does not allow (LoRA adapts linear layers: mha, fc1 and fc2).
    """
    if isinstance(subset, Mapping):
        items = [(str(c).strip().lower(), str(m).strip().lower()) for c, m in subset.items()]
    else:
        text = subset.strip().lower() if isinstance(subset, str) else None
        parts = [p.strip() for p in text.split("+")] if text is not None else [str(n).strip().lower() for n in subset]
        items = [(name, method or FULL) for name, _, method in (part.partition(":") for part in parts)]
    chosen: dict[str, str] = {}
    for name, method in items:  # "all" and "head" ("none") also join a union: "all+mha:lora", "head+fc1"
        for component in COMPONENTS if name == ALL else () if name in (HEAD, "none", "") else (name,):
            _check_method(component, method)
            chosen[component] = method
    return {c: chosen[c] for c in COMPONENTS if chosen.get(c, FROZEN) != FROZEN}


def _check_method(name: str, method: str) -> None:
    if name not in COMPONENTS:
        raise UserError(
            f'unknown component "{name}"{did_you_mean(name, COMPONENTS)}; '
            f'name components among {", ".join(COMPONENTS)} (joined by +), or "all" (every one) or "head" (none: the '
            "linear probe)"
        )
    if method not in ALLOWED_METHODS[name]:
        hint = " (LoRA adapts the linear layers of mha, fc1 and fc2)" if method == LORA else ""
        hint = hint if method in METHODS else did_you_mean(method, METHODS)
        raise UserError(
            f'component {name} cannot train by "{method}"{hint}; it allows {", ".join(ALLOWED_METHODS[name])}'
        )


def parse_subset(subset: str | Iterable[str] | Mapping[str, str]) -> tuple[str, ...]:
    """The components that train, in canonical order: "fc1+mha:lora" -> ("mha", "fc1"); "all"; "head" -> ().

    A subset is the union of its names: "all" is every component, "head" none (the head always trains), so
    "all+mha" is full finetuning and "head+mha" is mha. Raises UserError for an unknown name, listing the valid ones.
    """
    return tuple(parse_methods(subset))


def subset_name(subset: str | Iterable[str] | Mapping[str, str]) -> str:
    """The canonical name of a subset and its methods ("fc1+mha" -> "mha+fc1", {"mha": "lora"} -> "mha:lora";
    "all" for the six in full, "all:bitfit" for every bias, "head" for none)."""
    methods = parse_methods(subset if isinstance(subset, (str, Mapping)) else list(subset))
    if tuple(methods) == COMPONENTS and len(set(methods.values())) == 1:
        method = next(iter(methods.values()))
        return ALL if method == FULL else f"{ALL}:{method}"
    return "+".join(c if m == FULL else f"{c}:{m}" for c, m in methods.items()) or HEAD


def method_label(subset: str | Iterable[str] | Mapping[str, str]) -> str:
    """The methods a subset trains by, in ``METHODS`` order ("mha:lora+fc1" -> "full+lora"); "head" for none."""
    used = set(parse_methods(subset).values())
    return "+".join(m for m in METHODS if m in used) or HEAD


def check_depth(depth: str) -> str:
    """Raise UserError unless ``depth`` is one of ``DEPTHS`` or a block range "i" / "i-j" (i <= j); return it."""
    depth = str(depth)  # a YAML range of one block ("3") may come as a number
    match = _RANGE.match(depth)
    if depth in DEPTHS or (match and int(match.group(1)) <= int(match.group(2) or match.group(1))):
        return depth
    raise UserError(
        f'unknown depth "{depth}"{did_you_mean(str(depth), DEPTHS)}; use {", ".join(DEPTHS)} (thirds of the blocks) '
        'or a range of block indices such as "0-3"'
    )


def depth_blocks(depth: str, num_blocks: int) -> list[int] | None:
    """The block indices a ``depth`` names in a model of ``num_blocks`` blocks (None for "all").

    Thirds: "first" and "last" are the first and last round(n/3) blocks (at least one), "middle" those between
    (4 blocks: [0], [1, 2], [3]; 12: [0-3], [4-7], [8-11]). Raises UserError for a range beyond the model.
    """
    depth = check_depth(depth)
    if depth == "all":
        return None
    third = max(1, round(num_blocks / 3))
    named = {
        "first": range(third),
        "middle": range(third, num_blocks - third),
        "last": range(num_blocks - third, num_blocks),
    }
    if depth in named:
        blocks = list(named[depth])
        if not blocks or num_blocks < 3:
            raise UserError(f'depth "{depth}" needs at least 3 blocks; the model has {num_blocks}')
        return blocks
    match = _RANGE.match(depth)
    first, last = int(match.group(1)), int(match.group(2) or match.group(1))
    if last >= num_blocks:
        raise UserError(f'depth "{depth}" is out of range: the model has {num_blocks} blocks (0-{num_blocks - 1})')
    return list(range(first, last + 1))


def contiguous_depths(num_blocks: int) -> list[str]:
    """Every contiguous block range of a ``num_blocks``-block model, shortest first ("0", "1", ..., "0-1", ...)."""
    return [
        f"{i}" if n == 1 else f"{i}-{i + n - 1}" for n in range(1, num_blocks + 1) for i in range(num_blocks - n + 1)
    ]


def parameter_component(name: str, layout: Layout) -> tuple[str, int | None]:
    """Classify a parameter name as (component or "head", block index or None) by the model family's ``layout``.

    Raises UserError for a parameter the layout does not place, so that an unsupported architecture fails loudly
    instead of silently staying frozen.
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
    """How many blocks the model has (the length of its module ``layout.blocks``)."""
    return len(model.get_submodule(layout.blocks))


def component_parameters(model: nn.Module, component: str, *, layout: Layout) -> dict[str, nn.Parameter]:
    """All parameters of one component (or "head") across every block, by name."""
    if component != HEAD:
        parse_subset([component])
    return {name: p for name, p in model.named_parameters() if parameter_component(name, layout)[0] == component}


def count_parameters(model: nn.Module, *, layout: Layout) -> dict[str, int]:
    """Number of parameters per component and for the head, in canonical order."""
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
    """Train only the subset's components by their methods, and the head; freeze the rest; return trainable counts.

    ``full`` trains a component's parameters, ``bitfit`` its biases, ``lora`` its LoRA adapters, which must be in
    the model already (``vit.methods.apply_methods`` injects them first; the base weights they wrap stay frozen).
    ``blocks`` restricts the block components (ln1 ... fc2) to those block indices; ``emb`` and the head are
    unaffected. ``layout`` is the model family's (``vit.families.registry.layout_of(model)``). The result maps each
    component and "head" to its trainable count.
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
    """Whether parameter ``name`` of a component trained by ``method`` trains (LoRA adapters train only by lora)."""
    adapter = _LORA_PARAM.search(name) is not None
    if method == FULL:
        return not adapter
    if method == BITFIT:
        return is_bias(name) and not adapter
    return method == LORA and adapter


def is_bias(name: str) -> bool:
    """Whether a parameter is a bias, what BitFit trains: ``*.bias``, or a separate ``q_bias`` / ``v_bias`` (BEiT, EVA)."""
    last = name.rsplit(".", 1)[-1]
    return last == "bias" or last.endswith("_bias")


def is_adapter(name: str) -> bool:
    """Whether a parameter name is a LoRA adapter's (``...lora_A.default.weight``)."""
    return _LORA_PARAM.search(name) is not None


def lora_layers(model: nn.Module, component: str, block: int, layout: Layout) -> list[str]:
    """The full names of the layers of ``block`` that LoRA adapts in ``component`` (those of ``layout.lora`` the block
    has), in the layout's order."""
    names = [f"{layout.blocks}.{block}.{rel}" for rel in layout.lora.get(component, ())]
    return [name for name in names if _has_module(model, name)]


def _has_module(model: nn.Module, name: str) -> bool:
    try:
        return model.get_submodule(name) is not None
    except AttributeError:
        return False


def parameter_summary(model: nn.Module, *, layout: Layout) -> list[dict[str, Any]]:
    """Per component and block (None: model level): its parameters, its bias parameters, and the summed in + out
    widths of its LoRA layers (``lora_layers``); what ``count_trainable`` counts any method from, without torch."""
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
    """What ``freeze`` would return for this subset (with LoRA of ``lora_rank``), from a ``parameter_summary``."""
    methods = parse_methods(subset)
    per_method = {FULL: lambda r: r["params"], BITFIT: lambda r: r["bias"], LORA: lambda r: lora_rank * r["lora_width"]}
    counts = {c: 0 for c in (*COMPONENTS, HEAD)}
    for row in summary:
        component, block = row["component"], row["block"]
        method = FULL if component == HEAD else methods.get(component, FROZEN)
        if method != FROZEN and (block is None or blocks is None or block in blocks):
            counts[component] += per_method[method](row)
    return counts


def all_subsets(allow_head: bool = False) -> list[str]:
    """Names of all non-empty subsets of the six components, smallest first (and "head" first when allowed)."""
    subsets = [
        subset_name(combo) for k in range(1, len(COMPONENTS) + 1) for combo in itertools.combinations(COMPONENTS, k)
    ]
    return ([HEAD] if allow_head else []) + subsets


def component_flag(component: str) -> str:
    """Config key of the boolean that says whether a component trains: ``train_<name>``."""
    return f"train_{component}"


def method_flag(component: str) -> str:
    """Config key of the categorical that says how a component trains: ``method_<name>``."""
    return f"method_{component}"


COMPONENT_FLAGS = tuple(component_flag(c) for c in COMPONENTS)
METHOD_FLAGS = tuple(method_flag(c) for c in COMPONENTS)
ENCODING_KEYS = COMPONENT_FLAGS + METHOD_FLAGS  # what Optuna samples to make ``components``; not trial settings


def component_flags(subset: str) -> dict[str, bool]:
    """One boolean per component (``train_<name>``) for a subset name."""
    chosen = parse_subset(subset)
    return {component_flag(c): c in chosen for c in COMPONENTS}


def component_methods(subset: str) -> dict[str, str]:
    """How each component trains (``method_<name>``: frozen, full, lora or bitfit) for a subset name."""
    methods = parse_methods(subset)
    return {method_flag(c): methods.get(c, FROZEN) for c in COMPONENTS}
