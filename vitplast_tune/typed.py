"""Values checked and parsed by their type annotations: a settings dataclass's fields (``FinetuneConfig``,
``PretrainConfig``) typed by declaring them, and ``--set KEY=VALUE`` text read as the field's type. Plain Python."""

from __future__ import annotations

import math
import os
import types
import typing
from functools import cache
from typing import Any

from vitplast_tune.errors import UserError


@cache
def field_types(cls: type) -> dict[str, Any]:
    """The type of each field of a settings dataclass (``FinetuneConfig``, ``PretrainConfig``), from its annotations."""
    return typing.get_type_hints(cls)


def check_types(settings: Any) -> None:
    """Check that every field of a settings dataclass fits its annotation: a new field is typed by declaring it.

    The annotations understood: ``int``, ``float``, ``bool``, ``str``, ``X | None``, ``list[X]``.

    Args:
        settings: A settings dataclass (``FinetuneConfig``, ``PretrainConfig``).

    Raises:
        UserError: Naming the first field whose value does not fit.
    """
    for name, hint in field_types(type(settings)).items():
        check_type(name, getattr(settings, name), hint)


def check_type(name: str, value: Any, hint: Any) -> None:
    """Check that ``value`` fits the annotation ``hint`` (see ``fits``).

    Args:
        name: The setting's name, for the message.
        value: Its value.
        hint: Its annotation.

    Raises:
        UserError: The value does not fit; the message names ``name``.
    """
    if not fits(value, hint):
        raise UserError(f"{name} must be {describe_type(hint)}, got {value!r} ({_kind(value)})")


def fits(value: Any, hint: Any) -> bool:
    """Tell whether ``value`` is of type ``hint``.

    A bool is not a number, an int is a float, a float is finite, a path is a string.

    Args:
        value: The value.
        hint: The annotation.

    Returns:
        Whether it fits.
    """
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, h) for h in typing.get_args(hint))
    if origin in (list, tuple):
        item = (typing.get_args(hint) or (Any,))[0]
        return isinstance(value, (list, tuple)) and all(fits(v, item) for v in value)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, (str, os.PathLike))  # a path given as a Path (data_dir, weights)
    return isinstance(value, hint) if isinstance(hint, type) else True


def describe_type(hint: Any) -> str:
    """Name a type as a message does: ``int | None`` is "an integer or null".

    Args:
        hint: The annotation.

    Returns:
        Its name in words.
    """
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(h) for h in typing.get_args(hint))
    if origin in (list, tuple):
        item = (typing.get_args(hint) or (Any,))[0]
        return f"a list of {describe_type(item).removeprefix('an ').removeprefix('a ')}s"
    names = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string", type(None): "null"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _kind(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }
    return names.get(type(value), type(value).__name__)


def _optional(kind: Any) -> tuple[Any, bool]:
    """(the type, whether None is allowed) of a field annotated ``X`` or ``X | None``."""
    args = typing.get_args(kind)
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        others = [a for a in args if a is not type(None)]
        return others[0], len(others) < len(args)
    return kind, False


def parse_typed(raw: str, kind: Any) -> Any:
    """Read command-line text as a value of a field's type.

    Args:
        raw: The text, e.g. ``"0.05"``, ``"true"``, ``"9,10,11"`` or ``"none"``.
        kind: The field's annotation: str, int, float, bool or list[int], each optionally ``| None``.

    Returns:
        The value.

    Raises:
        ValueError: The text is not of that type.
    """
    kind, optional = _optional(kind)
    if optional and raw.lower() in ("none", "null"):
        return None
    if kind is bool:
        words = {
            "true": True,
            "yes": True,
            "on": True,
            "1": True,
            "false": False,
            "no": False,
            "off": False,
            "0": False,
        }
        if raw.lower() not in words:
            raise ValueError(raw)
        return words[raw.lower()]
    if kind is int:
        return int(raw)
    if kind is float:
        return float(raw)
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        inner = raw.strip("[]() ")
        return [parse_typed(v.strip(), item) for v in inner.split(",")] if inner else []
    return raw


def describe_parsed(kind: Any) -> str:
    """Name the text a field takes, as an error about ``--set`` says it.

    Args:
        kind: The field's annotation.

    Returns:
        E.g. "an integer", "a list of integers such as 0,1,2 or none".
    """
    kind, optional = _optional(kind)
    words = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
    text = "a list of integers such as 0,1,2" if typing.get_origin(kind) is list else words.get(kind, str(kind))
    return f"{text} or none" if optional else text
