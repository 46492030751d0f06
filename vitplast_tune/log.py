"""Set up the library's logger, ``vitplast_tune``, in the manner of ``optuna.logging``."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator

from vitplast_tune import environment
from vitplast_tune._compat.notices import STARTUP_NOTICES

ROOT = "vitplast_tune"
LEVEL_ENV = "VITPLAST_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_lock = threading.Lock()
_handler: logging.Handler | None = None


class _Stderr(logging.StreamHandler):
    """Write to whatever ``sys.stderr`` is when a record comes."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it; the property always answers sys.stderr
        pass


def get_logger(name: str) -> logging.Logger:
    """Return the logger of a module of the library, setting up the default handler on first use.

    Args:
        name: The module's name.

    Returns:
        The module's logger.
    """
    _default_handler()
    return logging.getLogger(name)


def _default_handler() -> None:
    global _handler
    with _lock:
        if _handler is not None:
            return
        _handler = _Stderr()
        _handler.setFormatter(logging.Formatter("%(message)s"))
        root = logging.getLogger(ROOT)
        root.addHandler(_handler)
        if root.level == logging.NOTSET:  # a level the user set before the first module loaded holds
            root.setLevel(environment_level() or logging.INFO)
        root.propagate = False


def set_verbosity(level: int) -> None:
    """Set the library logger's level.

    Args:
        level: ``logging.WARNING`` quiets its progress messages, ``logging.DEBUG`` adds more.
    """
    _default_handler()
    logging.getLogger(ROOT).setLevel(level)


def environment_level() -> int | None:
    """Read the level ``VITPLAST_LOG_LEVEL`` names.

    Returns:
        The ``logging`` level, or None when the variable names none.
    """
    name = (environment.read(LEVEL_ENV) or "").strip().upper()
    return getattr(logging, name) if name in LEVELS else None


def quiet_notices(shown: bool = False) -> None:
    """Let other projects' start-up notices through only when ``shown``; a failure still shows.

    Args:
        shown: Whether the notices show.
    """
    for name, level in STARTUP_NOTICES.items():
        logging.getLogger(name).setLevel(logging.NOTSET if shown else level)


def get_verbosity() -> int:
    """Return the library logger's level.

    Returns:
        The effective level of the ``vitplast_tune`` logger.
    """
    _default_handler()
    return logging.getLogger(ROOT).getEffectiveLevel()


def disable_default_handler() -> None:
    """Stop writing the library's messages to standard error, and pass them to the root logger."""
    _default_handler()
    root = logging.getLogger(ROOT)
    if _handler is not None:
        root.removeHandler(_handler)
    root.propagate = True


def enable_default_handler() -> None:
    """Write the library's messages to standard error again."""
    _default_handler()
    root = logging.getLogger(ROOT)
    if _handler is not None and _handler not in root.handlers:
        root.addHandler(_handler)
    root.propagate = False


@contextlib.contextmanager
def quieted(name: str) -> Iterator[None]:
    """Let only errors through another library's logger while the block runs.

    Args:
        name: The logger to quiet, e.g. ``"transformers"``.

    Yields:
        Nothing.
    """
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(logging.ERROR)  # setLevel, not .level: it clears the cache of what each logger lets through
    try:
        yield
    finally:
        logger.setLevel(before)
