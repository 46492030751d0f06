"""The exceptions for mistakes a user can fix: ``UserError`` and one subclass per kind of mistake (the space file,
the options, the data, resuming, the services a search records to), and how an option is spelled in a message:
``--max-steps`` on the command line, ``max_steps`` from Python."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# Whether messages name options as the command line's flags (the ``vitplast`` commands set it) or as keywords.
_FLAGS: ContextVar[bool] = ContextVar("vitplast_tune_flags", default=False)


class UserError(Exception):
    """Bad input from the user: the commands print its message on one line and exit with code 2."""


class SpaceError(UserError):
    """A space file (or a space given as a mapping or an object) that is missing or not valid."""


class OptionsError(UserError):
    """An option of a search (a keyword of ``run_search``, a flag of ``vitplast search``) or a setting not valid."""


class DataError(UserError):
    """A dataset, a data folder, model weights or another input file that cannot be used."""


class ResumeError(UserError):
    """A search that cannot be resumed as asked, or a new search that would take a recorded one's name."""


class ServicesError(UserError):
    """A storage, MLflow tracking store or Ray cluster that does not answer or cannot be written."""


class SearchNotFound(UserError, LookupError):
    """No search of that name is recorded in the storage.

    The message lists the known ones.
    """


def option(key: str, value: object = None) -> str:
    """An option as the user gave it: the flag on the command line, the keyword from Python.

    Args:
        key: the option's name in ``SearchOptions`` (``max_steps``).
        value: its value, shown after the name when given.

    Returns:
        ``--max-steps 20`` from the command line, ``max_steps=20`` from Python (without the value when None; a
        switch given True is the flag alone on the command line).
    """
    if _FLAGS.get():
        return f"--{key.replace('_', '-')}" + ("" if value is None or value is True else f" {value}")
    return key + ("" if value is None else f"={value!r}")


def speaking_flags() -> bool:
    """Tell whether messages name options as the command line's flags (in a ``vitplast`` command) or as keywords.

    Returns:
        True inside ``flags_spoken``: flags; else keywords.
    """
    return _FLAGS.get()


@contextmanager
def flags_spoken() -> Iterator[None]:
    """Name options as the command line's flags inside the block: the ``vitplast`` commands run in one.

    Outside it (after it, too) messages name options as Python keywords again, so a command run in-process (a
    test, a notebook cell calling ``main``) leaves the Python wording as it found it.

    Yields:
        Nothing: the block runs with flags spoken.
    """
    token = _FLAGS.set(True)
    try:
        yield
    finally:
        _FLAGS.reset(token)


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """The closest option to a word the user gave, as a hint for a message.

    An option that the word starts with, word by word, is closest (``mixup_alpha``: ``mixup``, as other libraries
    name its alpha), else the most similar spelling.

    Args:
        word: what the user gave.
        options: the names it may have meant.

    Returns:
        ``' (did you mean "x"?)'``, or ``''`` when none is close.
    """
    names, parts = [str(o) for o in options], str(word).split("_")
    leading = [n for n in names if n in ("_".join(parts[:i]) for i in range(1, len(parts)))]
    close = sorted(leading, key=len)[-1:] or difflib.get_close_matches(str(word), names, n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


class SearchInterrupted(Exception):
    """The search stopped before all its trials ended (Ctrl-C, SIGTERM).

    The message says how to resume it.

    Args:
        message: What happened, and the command that resumes the search.
        exit_code: What the command exits with: 130 after Ctrl-C (SIGINT), 143 after SIGTERM (128 + the signal).
    """

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


class SearchFailed(Exception):
    """Every trial of a search failed before it reported a validation accuracy: there is no answer.

    The message names the first trial's cause, and the commands exit with code 1.
    """


def trial_cause(error: BaseException | str) -> str:
    """The cause of a trial's failure in one line: the exception raised in the trial (not Ray's wrapper around it).

    Args:
        error: what Tune recorded of the failure (a ``RayTaskError`` wraps the trial's exception as ``cause``).

    Returns:
        ``<kind>: <first line of its message>``, at most 300 characters.
    """
    cause = getattr(error, "cause", None) or error
    if isinstance(cause, str):
        lines = [line.strip() for line in cause.splitlines() if line.strip()]
        return (lines[-1] if lines else "unknown")[:300]
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"[:300]
