"""The six finetunable components of a timm Vision Transformer, and freezing all but a subset.

A component is a named group of parameters (see PAPER.md):

    emb  patch_embed, cls/register tokens, pos_embed (model level)
    ln1  blocks[i].norm1           mha  blocks[i].attn (+ layer scale ls1)
    ln2  blocks[i].norm2           fc1  blocks[i].mlp.fc1
                                   fc2  blocks[i].mlp.fc2 (+ mlp.norm, layer scale ls2)

The classification head and the final norm ("head") always train.
A subset is written as a tuple of names in the canonical order above, or as a string:
"mha+fc1", "all" (full finetuning) or "head" (the linear probe: no component).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from vitplast_tune.errors import UserError, did_you_mean

if TYPE_CHECKING:  # torch only in annotations: the driver of a search imports this without torch
    from torch import nn

COMPONENTS: tuple[str, ...] = ("emb", "ln1", "mha", "ln2", "fc1", "fc2")
BLOCK_COMPONENTS: tuple[str, ...] = COMPONENTS[1:]
HEAD = "head"
ALL = "all"
# The paper's order of single components (by plasticity), then the embedding, full finetuning, linear probe.
TABLE_ORDER: tuple[str, ...] = ("mha", "fc1", "fc2", "ln2", "ln1", "emb", ALL, HEAD)

# The timm submodule of block i that each block component names (its input and output define plasticity).
BLOCK_MODULES: dict[str, str] = {"ln1": "norm1", "mha": "attn", "ln2": "norm2", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}
# Parameters of a block that belong to a component besides its module's own (layer scales, the MLP's norm).
_EXTRA_PREFIXES: dict[str, tuple[str, ...]] = {"mha": ("ls1.",), "fc2": ("mlp.norm.", "ls2.")}
# Parameter-name prefixes inside a block, per component ("mlp.fc1" also matches fc1_g / fc1_x of gated MLPs).
_BLOCK_PREFIXES: dict[str, tuple[str, ...]] = {
    c: (m if "." in m else f"{m}.", *_EXTRA_PREFIXES.get(c, ())) for c, m in BLOCK_MODULES.items()
}
_EMB_PREFIXES = ("patch_embed.", "cls_token", "reg_token", "pos_embed", "norm_pre.")
_HEAD_PREFIXES = ("head.", "norm.", "fc_norm.", "attn_pool.")
_BLOCK_PARAM = re.compile(r"^blocks\.(\d+)\.(.+)$")


def parse_subset(subset: str | Iterable[str]) -> tuple[str, ...]:
    """Turn "mha+fc1", "all", "head" or a list of names into a tuple in canonical order.

    A subset is the union of its names: "all" is every component, "head" none (the head always trains), so
    "all+mha" is full finetuning and "head+mha" is mha. Raises UserError for an unknown name, listing the valid ones.
    """
    if isinstance(subset, str):
        text = subset.strip().lower()
        names = [part.strip() for part in text.split("+")] if text else []
    else:
        names = [str(n).strip().lower() for n in subset]
    chosen: set[str] = set()
    for name in names:
        if name == ALL:
            chosen.update(COMPONENTS)
        elif name not in (HEAD, "none"):
            if name not in COMPONENTS:
                raise UserError(
                    f'unknown component "{name}"{did_you_mean(name, COMPONENTS)}; name components among '
                    f'{", ".join(COMPONENTS)} (joined by +), or "all" (every one) or "head" (none: the linear probe)'
                )
            chosen.add(name)
    return tuple(c for c in COMPONENTS if c in chosen)


def subset_name(subset: str | Iterable[str]) -> str:
    """The canonical name of a subset ("fc1+mha" or [fc1, mha] -> "mha+fc1"; "all" for the six, "head" for none)."""
    names = parse_subset(subset if isinstance(subset, str) else list(subset))
    if names == COMPONENTS:
        return ALL
    return "+".join(names) if names else HEAD


def parameter_component(name: str) -> tuple[str, int | None]:
    """Classify a parameter name of a timm ViT as (component or "head", block index or None).

    Raises UserError for a parameter this mapping does not know, so that an unsupported
    architecture fails loudly instead of silently staying frozen.
    """
    if name.startswith(_EMB_PREFIXES):
        return "emb", None
    if name.startswith(_HEAD_PREFIXES):
        return HEAD, None
    match = _BLOCK_PARAM.match(name)
    if match:
        block, rest = int(match.group(1)), match.group(2)
        for component, prefixes in _BLOCK_PREFIXES.items():
            if rest.startswith(prefixes):
                return component, block
    raise UserError(
        f'parameter "{name}" belongs to no known ViT component; vitplast_tune supports '
        "timm VisionTransformer models (ViT, DeiT, ...)"
    )


def component_parameters(model: nn.Module, component: str) -> dict[str, nn.Parameter]:
    """All parameters of one component (or "head") across every block, by name."""
    if component != HEAD:
        parse_subset([component])
    return {name: p for name, p in model.named_parameters() if parameter_component(name)[0] == component}


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Number of parameters per component and for the head, in canonical order."""
    counts = {c: 0 for c in (*COMPONENTS, HEAD)}
    for name, p in model.named_parameters():
        counts[parameter_component(name)[0]] += p.numel()
    return counts


def freeze(
    model: nn.Module,
    subset: str | Iterable[str],
    blocks: Sequence[int] | range | None = None,
) -> dict[str, int]:
    """Freeze every parameter except the subset's components and the head; return trainable counts.

    ``blocks`` restricts the block components (ln1 ... fc2) to those block indices; ``emb`` and
    the head are unaffected. The result maps each component and "head" to its trainable count.
    """
    chosen = set(parse_subset(subset))
    allowed_blocks = None if blocks is None else set(blocks)
    num_blocks = len(getattr(model, "blocks", ()))
    if allowed_blocks is not None and any(not 0 <= b < num_blocks for b in allowed_blocks):
        raise UserError(f"blocks {sorted(allowed_blocks)} out of range: the model has {num_blocks}")
    trainable = {c: 0 for c in (*COMPONENTS, HEAD)}
    for name, p in model.named_parameters():
        component, block = parameter_component(name)
        train = component == HEAD or (
            component in chosen and (block is None or allowed_blocks is None or block in allowed_blocks)
        )
        p.requires_grad_(train)
        if train:
            trainable[component] += p.numel()
    return trainable
