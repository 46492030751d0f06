"""The one exception type for mistakes a user can fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad input from the user: the scripts print its message on one line and exit with code 2."""


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """Return ' (did you mean "x"?)' for the closest option to ``word``, or '' when none is close."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


class SearchInterrupted(Exception):
    """The search stopped before all its trials ended (Ctrl-C, SIGTERM); the message says how to resume it.

    ``exit_code`` is what the command exits with: 130 after Ctrl-C (SIGINT), 143 after SIGTERM (128 + the signal).
    """

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code
