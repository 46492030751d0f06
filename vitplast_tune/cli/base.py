"""What every command shares: a parser whose mistakes are one line, and the main that turns a UserError into one
line on stderr and exit code 2 (a search whose every trial failed into 1, an interrupted one into 130 or 143)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from vitplast_tune import log
from vitplast_tune.errors import SearchFailed, SearchInterrupted, UserError, flags_spoken


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose mistakes are one line on stderr, ``error: <prog>: <message> (see --help)``, exit 2."""

    def error(self, message: str) -> NoReturn:
        """Print the mistake on one line and exit with code 2 (argparse prints the whole usage first)."""
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """Call ``main()`` and exit with its code; a UserError prints ``error: <message>`` and exits 2, an interrupted
    search exits 130 (Ctrl-C) or 143 (SIGTERM), a search whose every trial failed 1. Messages name options as flags here (``errors.flags_spoken``)."""
    log.quiet_notices(shown=log.environment_level() == logging.DEBUG)  # a command's own flags may show them
    try:
        with flags_spoken():
            code = main()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except SearchFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except SearchInterrupted as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)  # 130 after Ctrl-C, 143 after SIGTERM
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


def quiet_library(quiet: bool, verbose: bool = False) -> None:
    """Set how much a command says on stderr: the library's messages at WARNING and above only (``--quiet``), at DEBUG
    with other projects' start-up notices (``--verbose``), else at ``VITPLAST_LOG_LEVEL``'s level or INFO (``log``);
    the notices (Ray's token authentication, MLflow's new tables) show only at DEBUG."""
    level = logging.WARNING if quiet else logging.DEBUG if verbose else log.environment_level() or logging.INFO
    log.set_verbosity(level)
    log.quiet_notices(shown=level <= logging.DEBUG)


def plain(value: Any) -> Any:
    """A value as JSON takes it: tables as lists of rows, dataclasses and mappings as objects, numpy scalars as
    Python's, NaN as null, paths as text."""
    import math
    from pathlib import PurePath

    import pandas as pd

    if isinstance(value, pd.DataFrame):
        return [plain(row) for row in value.to_dict(orient="records")]
    if isinstance(value, pd.Series):
        return plain(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    value = value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)  # anything else (a timestamp, a settings object) by its text


def print_json(value: Any) -> None:
    """Print ``value`` as one JSON document on stdout (``plain`` turns tables, dataclasses and numpy values into it)."""
    import json

    print(json.dumps(plain(value), indent=2), flush=True)


def positive_int(text: str) -> int:
    """An argparse type: a positive integer."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def add_dataclass_flags(parser: argparse.ArgumentParser, defaults: Any) -> None:
    """One ``--flag`` per field of a dataclass instance, typed and defaulted from it, its help from the field's
    ``help`` metadata."""
    for f in dataclasses.fields(defaults):
        value = getattr(defaults, f.name)
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=type(value),
            default=value,
            help=f"{f.metadata.get('help', f.name)} (default: {value:g})",
        )
