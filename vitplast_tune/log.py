"""The library's logger, ``vitplast_tune``, in the manner of ``optuna.logging``: what the library says while it works
(notes, where it runs, what it measured, progress) goes through ``logging.getLogger("vitplast_tune")`` and its
children, so a notebook or a service that embeds the library can quiet, raise or redirect it; the commands set its
level (``--quiet``). Results (summary tables, the answer, JSON) are the commands' printed output on standard output,
not log lines.

By default the library's messages at INFO and above go to standard error, one line each. A level the user sets on
the ``vitplast_tune`` logger holds, before or after the import: the default level (``VITPLAST_LOG_LEVEL``, else INFO)
is set only where none is. ``disable_default_handler()`` leaves the messages to the application's own logging
configuration. The commands also quiet other projects' start-up notices (``quiet_notices``) below DEBUG.
"""

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
    """A handler writing to whatever ``sys.stderr`` is when a record comes (a notebook's or a test's capture too)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it; the property always answers sys.stderr
        pass


def get_logger(name: str) -> logging.Logger:
    """The logger of a module of the library, the default handler set up on first use.

    Args:
        name: the module's name, ``vitplast_tune.<module>``.

    Returns:
        The module's logger, a child of ``vitplast_tune``.
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
    """The level ``VITPLAST_LOG_LEVEL`` names (DEBUG, INFO, WARNING or ERROR, in any case).

    Returns:
        The ``logging`` level, or None when the variable is unset, empty or names none of them.
    """
    name = (environment.read(LEVEL_ENV) or "").strip().upper()
    return getattr(logging, name) if name in LEVELS else None


def quiet_notices(shown: bool = False) -> None:
    """Let other projects' start-up notices through only when ``shown``.

    The notices are ``_compat.notices.STARTUP_NOTICES``': Ray's token-authentication warning, MLflow's "Creating
    initial MLflow database tables"; a failure still shows.

    Args:
        shown: Whether the notices show (``--verbose``): their loggers' levels are then left to their projects.
    """
    for name, level in STARTUP_NOTICES.items():
        logging.getLogger(name).setLevel(logging.NOTSET if shown else level)


def get_verbosity() -> int:
    """The library logger's level.

    Returns:
        The effective level of the ``vitplast_tune`` logger.
    """
    _default_handler()
    return logging.getLogger(ROOT).getEffectiveLevel()


def disable_default_handler() -> None:
    """Stop writing the library's messages to standard error, and let them reach the root logger's handlers."""
    _default_handler()
    root = logging.getLogger(ROOT)
    if _handler is not None:
        root.removeHandler(_handler)
    root.propagate = True


def enable_default_handler() -> None:
    """Write the library's messages to standard error again (the default)."""
    _default_handler()
    root = logging.getLogger(ROOT)
    if _handler is not None and _handler not in root.handlers:
        root.addHandler(_handler)
    root.propagate = False


@contextlib.contextmanager
def quieted(name: str, level: int = logging.ERROR) -> Iterator[None]:
    """Let only records at ``level`` and above through the logger ``name`` (another library's) while the block runs.

    Args:
        name: the logger to quiet, e.g. ``"transformers"``.
        level: the lowest level let through meanwhile.

    Yields:
        Nothing: the block runs with the logger quieted; its level is restored after.
    """
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)  # setLevel, not .level: it clears the cache of what each logger lets through
    try:
        yield
    finally:
        logger.setLevel(before)
