"""A YAML file a user gives (a space file, a pre-registration) read within bounds: at most ``MAX_BYTES``, UTF-8 text,
no aliases (``*name``: a few lines of them can stand for gigabytes, the "billion laughs"), nested at most a few
hundred levels. Each problem is one ``UserError`` naming the file and where in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vitplast_tune.errors import UserError

MAX_BYTES = 2**20  # a space file is a few KiB; a file over a MiB is not one


class _NoAliases(yaml.SafeLoader):
    """PyYAML's safe loader, refusing an alias where it meets one (before the node it names is used)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"an alias (*{event.anchor}), which this file may not hold", event.start_mark
            )
        return super().compose_node(parent, index)


def read_yaml(path: Path, what: str, error: type[UserError] = UserError) -> tuple[Any, str]:
    """Read a YAML file within bounds: its size, its encoding, no aliases, its nesting.

    Args:
        path: The file.
        what: What it is, for the messages (``space file``).
        error: The ``UserError`` kind to raise.

    Returns:
        The value it holds and its text.

    Raises:
        UserError: (of kind ``error``) the file cannot be read, is over ``MAX_BYTES``, holds a byte that is not
            UTF-8 (its offset named), is not YAML (its line named), holds an alias or is nested too deeply.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)  # no more: a device or a pipe given as the file ends here too
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror})") from None
    if len(data) > MAX_BYTES:
        raise error(f"{path}: over {MAX_BYTES:,} bytes, more than a {what} holds; check the path")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: byte {exc.start} (0x{data[exc.start]:02x}) is not UTF-8; save the {what} as UTF-8 text"
        ) from None
    try:
        return yaml.load(text, Loader=_NoAliases), text  # a SafeLoader: no Python objects made
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise error(f"{path}: malformed YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise error(f"{path}: nested too deeply to be a {what}") from None
