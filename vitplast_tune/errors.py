"""Define the errors a user can fix, one kind per mistake, and spell options as the user gave them."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# Whether messages name options as the command line's flags (the ``vitplast`` commands set it) or as keywords.
_FLAGS: ContextVar[bool] = ContextVar("vitplast_tune_flags", default=False)


class UserError(Exception):
    """Report bad input; the commands print its message on one line and exit with code 2."""


class SpaceError(UserError):
    """Report a space file that is missing or not valid."""


class OptionsError(UserError):
    """Report an option or a setting that is not valid."""


class DataError(UserError):
    """Report a dataset, weights or another input file that cannot be used."""


class ResumeError(UserError):
    """Report a search that cannot resume as asked, or a new search that takes a recorded name."""


class ServicesError(UserError):
    """Report a storage, tracking store or Ray cluster that does not answer or cannot be written."""


class SearchNotFound(UserError, LookupError):
    """Report that no search of that name is recorded; the message lists the known ones."""


def option(key: str, value: object = None) -> str:
    """Spell an option as the user gave it: ``--max-steps 20`` from the command line, ``max_steps=20`` from Python.

    ``key`` is the option's name in ``SearchOptions``; ``value``, when given, follows the name.
    """
    if _FLAGS.get():
        return f"--{key.replace('_', '-')}" + ("" if value is None or value is True else f" {value}")
    return key + ("" if value is None else f"={value!r}")


def speaking_flags() -> bool:
    """Tell whether messages name options as the command line's flags (True inside ``flags_spoken``)."""
    return _FLAGS.get()


@contextmanager
def flags_spoken() -> Iterator[None]:
    """Name options as the command line's flags inside the block; the ``vitplast`` commands run in one."""
    token = _FLAGS.set(True)
    try:
        yield
    finally:
        _FLAGS.reset(token)


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """Find the closest of ``options`` to a word the user gave, as a hint for a message.

    Returns ``' (did you mean "x"?)'``, or ``''`` when none is close.
    """
    names, parts = [str(o) for o in options], str(word).split("_")
    leading = [n for n in names if n in ("_".join(parts[:i]) for i in range(1, len(parts)))]
    close = sorted(leading, key=len)[-1:] or difflib.get_close_matches(str(word), names, n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


class SearchInterrupted(Exception):
    """Report a search that stopped before all its trials ended; the message says how to resume it.

    Args:
        message: What happened, and the command that resumes the search.
        exit_code: The command's exit code: 130 after Ctrl-C, 143 after SIGTERM.
    """

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


class SearchFailed(Exception):
    """Report that every trial failed before it reported a validation accuracy; the commands exit with 1."""


def trial_cause(error: BaseException | str) -> str:
    """Say in one line why a trial failed: ``<kind>: <first line of its message>``, at most 300 characters."""
    cause = getattr(error, "cause", None) or error
    if isinstance(cause, str):
        lines = [line.strip() for line in cause.splitlines() if line.strip()]
        return (lines[-1] if lines else "unknown")[:300]
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"[:300]
