"""Holds for tests: a phase of a job kept open until a signal lands there, so that a test that signals a phase knows
the signal reaches that phase (never a guess at how long the phase lasts on a loaded machine).

Only under ``VITPLAST_HOLD=<phase>[,<phase>...]:<folder>``, which a test sets and nothing else does: ``hold(phase)``
writes ``<folder>/<phase>.held`` once the job reaches the phase, then waits there until a signal has come (its
handler raised, or ``note_signal`` recorded one a handler held back), ``<folder>/<phase>.release`` appears, or
``LIMIT_S`` have passed. Without the variable ``hold`` returns at once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from vitplast_tune import environment

HOLD_ENV = "VITPLAST_HOLD"
LIMIT_S = 600.0  # the longest a held phase waits for its signal
POLL_S = 0.05

_noted: list[int] = []  # the signals a handler held back while a phase was held (``note_signal``)


def held_phases() -> tuple[set[str], Path | None]:
    """The phases ``VITPLAST_HOLD`` names and its folder (none and None when it is unset or malformed)."""
    phases, sep, folder = (environment.read(HOLD_ENV) or "").partition(":")
    if not sep or not folder:
        return set(), None
    return {p.strip() for p in phases.split(",") if p.strip()}, Path(folder)


def note_signal(signum: int) -> None:
    """Record a signal that a handler held back (``interrupts.deferred``): a held phase ends when it comes."""
    _noted.append(signum)


def hold(phase: str) -> None:
    """Under ``VITPLAST_HOLD`` naming ``phase``: say the phase is reached (``<phase>.held``) and wait for a signal, a
    ``<phase>.release`` file or ``LIMIT_S``; otherwise nothing.

    Args:
        phase: the phase's name, e.g. ``"end"`` (a search's end phase, its trial table written).
    """
    phases, folder = held_phases()
    if phase not in phases or folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    _noted.clear()
    (folder / f"{phase}.held").write_text(f"{os.getpid()}\n")
    release, deadline = folder / f"{phase}.release", time.monotonic() + LIMIT_S
    while not _noted and not release.exists() and time.monotonic() < deadline:
        time.sleep(POLL_S)  # a signal whose handler raises ends the wait here
