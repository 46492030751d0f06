"""Name the components, subsets, methods and depths of a finetuning run, without torch or a model."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping

from vitplast_tune.errors import UserError, did_you_mean

COMPONENTS: tuple[str, ...] = ("emb", "ln1", "mha", "ln2", "fc1", "fc2")
BLOCK_COMPONENTS: tuple[str, ...] = COMPONENTS[1:]
HEAD = "head"
ALL = "all"
# The paper's order of single components (by plasticity), then the embedding, full finetuning, linear probe.
TABLE_ORDER: tuple[str, ...] = ("mha", "fc1", "fc2", "ln2", "ln1", "emb", ALL, HEAD)


FULL, FROZEN, LORA, BITFIT = "full", "frozen", "lora", "bitfit"
METHODS: tuple[str, ...] = (FROZEN, FULL, LORA, BITFIT)
LORA_COMPONENTS: tuple[str, ...] = ("mha", "fc1", "fc2")  # the components made of linear layers, which LoRA adapts
ALLOWED_METHODS: dict[str, tuple[str, ...]] = {
    c: (FROZEN, FULL, LORA, BITFIT) if c in LORA_COMPONENTS else (FROZEN, FULL, BITFIT) for c in COMPONENTS
}
DEPTHS: tuple[str, ...] = ("all", "first", "middle", "last")  # thirds of the blocks; or a range "i-j"
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_methods(subset: str | Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    """Read the method of each component that trains: "mha:lora+fc1" -> {"mha": "lora", "fc1": "full"}.

    ``subset`` is a subset's name, a list of names, "all", "head", or a mapping of component to method. Raises UserError
    when a name is unknown or a component does not allow its method.
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
    """Read the components that train, in canonical order: "fc1+mha:lora" -> ("mha", "fc1"), "head" -> ()."""
    return tuple(parse_methods(subset))


def subset_name(subset: str | Iterable[str] | Mapping[str, str]) -> str:
    """Name a subset and its methods canonically: "fc1+mha" -> "mha+fc1", {"mha": "lora"} -> "mha:lora".

    "all" is the six in full, "all:bitfit" every bias, "head" none.
    """
    methods = parse_methods(subset if isinstance(subset, (str, Mapping)) else list(subset))
    if tuple(methods) == COMPONENTS and len(set(methods.values())) == 1:
        method = next(iter(methods.values()))
        return ALL if method == FULL else f"{ALL}:{method}"
    return "+".join(c if m == FULL else f"{c}:{m}" for c, m in methods.items()) or HEAD


def method_label(subset: str | Iterable[str] | Mapping[str, str]) -> str:
    """Name the methods a subset trains by: "mha:lora+fc1" -> "full+lora", none -> "head"."""
    used = set(parse_methods(subset).values())
    return "+".join(m for m in METHODS if m in used) or HEAD


def check_depth(depth: str) -> str:
    """Check that a depth is one of ``DEPTHS`` or a block range "i" or "i-j" with i <= j; return it as text."""
    depth = str(depth)
    match = _RANGE.match(depth)
    if depth in DEPTHS or (match and int(match.group(1)) <= int(match.group(2) or match.group(1))):
        return depth
    raise UserError(
        f'unknown depth "{depth}"{did_you_mean(str(depth), DEPTHS)}; use {", ".join(DEPTHS)} (thirds of the blocks) '
        'or a range of block indices such as "0-3"'
    )


def depth_blocks(depth: str, num_blocks: int) -> list[int] | None:
    """List the block indices a depth names in a model (None for "all").

    Raises UserError when the depth is unknown, takes thirds of fewer than 3 blocks, or runs beyond the model.
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
    """List every contiguous block range of a model as a depth, shortest first."""
    return [
        f"{i}" if n == 1 else f"{i}-{i + n - 1}" for n in range(1, num_blocks + 1) for i in range(num_blocks - n + 1)
    ]


def all_subsets(allow_head: bool = False) -> list[str]:
    """List the names of all non-empty subsets of the six components, smallest first ("head" first if allowed)."""
    subsets = [
        subset_name(combo) for k in range(1, len(COMPONENTS) + 1) for combo in itertools.combinations(COMPONENTS, k)
    ]
    return ([HEAD] if allow_head else []) + subsets


def component_flag(component: str) -> str:
    """Name the config key of the boolean that says whether a component trains: ``train_<component>``."""
    return f"train_{component}"


def method_flag(component: str) -> str:
    """Name the config key of the categorical that says how a component trains: ``method_<component>``."""
    return f"method_{component}"


COMPONENT_FLAGS = tuple(component_flag(c) for c in COMPONENTS)
METHOD_FLAGS = tuple(method_flag(c) for c in COMPONENTS)
ENCODING_KEYS = COMPONENT_FLAGS + METHOD_FLAGS  # what Optuna samples to make ``components``; not trial settings


def component_flags(subset: str) -> dict[str, bool]:
    """Encode a subset as one boolean per component, keyed by ``component_flag``."""
    chosen = parse_subset(subset)
    return {component_flag(c): c in chosen for c in COMPONENTS}


def component_methods(subset: str) -> dict[str, str]:
    """Encode a subset as the method of each component, keyed by ``method_flag``."""
    methods = parse_methods(subset)
    return {method_flag(c): methods.get(c, FROZEN) for c in COMPONENTS}
