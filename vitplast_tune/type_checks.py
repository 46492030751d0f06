"""Check and parse values by their type annotations: settings dataclasses' fields and ``--set KEY=VALUE`` text."""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import math
import os
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any

from vitplast_tune.errors import OptionsError, UserError, did_you_mean


@cache
def field_types(cls: type) -> dict[str, Any]:
    """Return the type of each field of a settings dataclass, from its annotations."""
    return typing.get_type_hints(cls)


def check_types(
    settings: Any, skip: tuple[str, ...] = (), label: Callable[[str], str] = str, error: type[UserError] = UserError
) -> None:
    """Check that every field of a dataclass fits its annotation, so a new field is typed by declaring it.

    ``skip`` names fields checked elsewhere; ``label`` names a field in the message; ``error`` is the UserError kind
    raised.
    """
    hints = field_types(type(settings))
    for f in dataclasses.fields(settings):
        if f.name not in skip and not fits(value := getattr(settings, f.name), hints[f.name]):
            raise error(f"{label(f.name)} must be {describe_type(hints[f.name])}, got {_shown(value)}")


def fits(value: Any, hint: Any) -> bool:
    """Tell whether ``value`` is of type ``hint``.

    A bool is not a number, an int is a float, a float is finite and a path is a string. Lists and tuples match each
    other, with their items checked. A type that cannot be checked at run time lets every value through.
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, h) for h in args)
    if origin is typing.Literal:
        return value in args
    if origin in (list, tuple, collections.abc.Sequence):
        item = (args or (Any,))[0]
        return isinstance(value, (list, tuple)) and all(fits(v, item) for v in value)
    if origin in (dict, collections.abc.Mapping):
        key, item = args or (Any, Any)
        return isinstance(value, collections.abc.Mapping) and all(
            fits(k, key) and fits(v, item) for k, v in value.items()
        )
    if origin is collections.abc.Callable:
        return callable(value)
    if hint is Any or isinstance(hint, (str, typing.TypeVar)) or getattr(hint, "_is_protocol", False):
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
        return isinstance(value, (str, os.PathLike))
    return isinstance(value, origin or hint) if isinstance(origin or hint, type) else True


def describe_type(hint: Any) -> str:
    """Name a type as a message does: ``int | None`` is "an integer or null"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    plural = lambda item: f"{describe_type(item).removeprefix('an ').removeprefix('a ')}s"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(h) for h in args)
    if origin in (list, tuple, collections.abc.Sequence):
        return f"a list of {plural((args or (Any,))[0])}"
    if origin in (dict, collections.abc.Mapping):
        key, item = args or (Any, Any)
        return f"a mapping of {plural(key)} to {plural(item)}"
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    names = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string", type(None): "null"}
    if hint in names:
        return names[hint]
    name = getattr(hint, "__name__", str(hint))
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}" if isinstance(hint, type) else name


P = typing.ParamSpec("P")
R = typing.TypeVar("R")


def checked(**at_least: int) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Check a public function's arguments against their annotations before it runs.

    A value of the wrong type, a count below its floor (``at_least``, by argument name) or an unknown keyword raises one
    ``OptionsError`` that names the function, the argument and what it takes.
    """

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            name = f"{function.__name__}()"
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                unknown = next((k for k in kwargs if k not in signature.parameters), None)
                hint = did_you_mean(unknown, signature.parameters) if unknown else ""
                raise OptionsError(f"{name}: {exc}{hint}") from None
            hints = _hints(function)
            for key, value in bound.arguments.items():
                if signature.parameters[key].kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                    continue
                if key in hints and not fits(value, hints[key]):
                    raise OptionsError(f"{name} takes {key} as {describe_type(hints[key])}, got {_shown(value)}")
                if key in at_least and isinstance(value, int) and value < at_least[key]:
                    raise OptionsError(f"{name} takes {key} as an integer of at least {at_least[key]}, got {value}")
            return function(*args, **kwargs)

        return call

    return decorate


@functools.cache
def _hints(function: Callable) -> dict[str, Any]:
    """Return a function's annotations as types, leaving out those only type checkers can read."""
    found = {}
    for key, text in function.__annotations__.items():
        try:
            found[key] = typing.get_type_hints(_Only(text, function), function.__globals__)["value"]
        except Exception:  # a name imported under TYPE_CHECKING, or a form this Python cannot evaluate
            continue
    return found


class _Only:
    """Hold one annotation as an object ``typing.get_type_hints`` reads."""

    def __init__(self, annotation: Any, function: Callable):
        self.__annotations__ = {"value": annotation}
        self.__module__ = function.__module__


def _shown(value: Any) -> str:
    """Show a value and its kind on one line, at most 60 characters."""
    text = " ".join(repr(value).split())
    return f"{text if len(text) <= 60 else text[:57] + '...'} ({_kind(value)})"


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
    """Return the type of a field annotated ``X`` or ``X | None``, and whether None is allowed."""
    args = typing.get_args(kind)
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        others = [a for a in args if a is not type(None)]
        return others[0], len(others) < len(args)
    return kind, False


def _parse_typed(raw: str, kind: Any) -> Any:
    """Read command-line text as a value of a field's type, raising ValueError when it is not one."""
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
        return [_parse_typed(v.strip(), item) for v in inner.split(",")] if inner else []
    return raw


def _describe_parsed(kind: Any) -> str:
    """Name the text a field takes, as an error about ``--set`` says it."""
    kind, optional = _optional(kind)
    words = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
    text = "a list of integers such as 0,1,2" if typing.get_origin(kind) is list else words.get(kind, str(kind))
    return f"{text} or none" if optional else text
