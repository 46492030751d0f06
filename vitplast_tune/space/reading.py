"""Read a YAML file a user gives within bounds: its size, UTF-8, no aliases, a bounded nesting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vitplast_tune.errors import UserError

MAX_BYTES = 2**20  # a space file is a few KiB; a file over a MiB is not one


class _NoAliases(yaml.SafeLoader):
    """Load YAML safely, refusing an alias where it meets one."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"an alias (*{event.anchor}), which this file may not hold", event.start_mark
            )
        return super().compose_node(parent, index)


def _read_yaml(path: Path, what: str, error: type[UserError] = UserError) -> tuple[Any, str]:
    """Read a YAML file within bounds and return its value and text, raising ``error`` at a broken bound."""
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
