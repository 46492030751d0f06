"""Holds for tests: a phase of a job kept open until a signal lands there, so that a test that signals a phase knows
the signal reaches that phase (never a guess at how long the phase lasts on a loaded machine).

Only under ``VITPLAST_HOLD=<phase>[,<phase>...]:<folder>``, which a test sets and nothing else does: ``hold(phase)``
writes ``<folder>/<phase>.held`` once the job reaches the phase, then waits there until a signal has come (SIGINT or
SIGTERM: its handler raised, returned, or held it back and said so with ``note_signal``), ``<folder>/<phase>.release``
appears, or ``LIMIT_S`` have passed. Without the variable ``hold`` returns at once.

The phases: ``end`` (a search's end phase, its trial table written; ``run.driver``) and ``checkpoint`` (the driver
has taken a trial's report with a checkpoint, another trial having ended; ``run.guard.Watch``): while the driver
waits there, Tune takes no report, so the held trial waits at its next one and cannot end before the signal.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from vitplast_tune import environment

HOLD_ENV = "VITPLAST_HOLD"
LIMIT_S = 600.0  # the longest a held phase waits for its signal
POLL_S = 0.05

_noted: list[int] = []  # the signals a handler held back while a phase was held (``note_signal``)


def held_phases() -> tuple[set[str], Path | None]:
    """Read the phases ``VITPLAST_HOLD`` names, and its folder.

    Returns:
        The phases and the folder; none and None when it is unset or malformed.
    """
    phases, sep, folder = (environment.read(HOLD_ENV) or "").partition(":")
    if not sep or not folder:
        return set(), None
    return {p.strip() for p in phases.split(",") if p.strip()}, Path(folder)


def note_signal(signum: int) -> None:
    """Record a signal that a handler held back (``interrupts.deferred``): a held phase ends when it comes.

    Args:
        signum: The signal's number.
    """
    _noted.append(signum)


def hold(phase: str) -> None:
    """Hold a phase that ``VITPLAST_HOLD`` names: say it is reached, and wait; otherwise do nothing.

    Saying means writing ``<phase>.held``; the wait ends at a signal, a ``<phase>.release`` file or ``LIMIT_S``.

    Args:
        phase: the phase's name, e.g. ``"end"`` (a search's end phase, its trial table written).
    """
    phases, folder = held_phases()
    if phase not in phases or folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    _noted.clear()
    saved = _noting_signals()
    try:
        (folder / f"{phase}.held").write_text(f"{os.getpid()}\n")
        release, deadline = folder / f"{phase}.release", time.monotonic() + LIMIT_S
        while not _noted and not release.exists() and time.monotonic() < deadline:
            time.sleep(POLL_S)  # a signal whose handler raises ends the wait here
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _noting_signals() -> dict[int, Any]:
    """SIGINT's and SIGTERM's handlers wrapped so that each notes its signal before it runs (a handler that only
    sets a flag, as Tune's graceful stop does, ends the hold too); the handlers replaced (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    saved = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if callable(handler):

            def noting(received, frame, handler=handler):
                _noted.append(received)
                handler(received, frame)

            saved[signum] = handler
            signal.signal(signum, noting)
    return saved
