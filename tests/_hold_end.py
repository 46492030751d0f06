"""Run ``vitplast search`` with its end phase held open until a signal comes, so that a test that signals the end
phase knows its signal lands there (never a guess at how long the phase lasts on a loaded machine).

    python tests/_hold_end.py FOLDER [SEARCH ARGUMENTS...]

The hook is the test's, monkeypatched in from here: once every trial has ended and the trial table is written
(``run.driver._check_some_reported`` has returned), the search writes ``FOLDER/end.held`` and waits until SIGINT or
SIGTERM comes (its handler runs as it would: one that raises ends the wait by raising, one that returns or holds the
signal back ends it too) or ``LIMIT_S`` have passed.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from vitplast_tune.cli.search import entry
from vitplast_tune.run import driver

LIMIT_S = 600.0  # the longest the end phase waits for its signal


def hold(folder: Path) -> None:
    """Say the end phase is reached (``folder/end.held``), and wait there for a signal."""
    noted: list[int] = []
    saved = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if callable(handler):

            def noting(received, frame, handler=handler):
                noted.append(received)
                handler(received, frame)

            saved[signum] = handler
            signal.signal(signum, noting)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "end.held").write_text(f"{os.getpid()}\n")
        deadline = time.monotonic() + LIMIT_S
        while not noted and time.monotonic() < deadline:
            time.sleep(0.05)  # a signal whose handler raises ends the wait here
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def main() -> None:
    folder, reported = Path(sys.argv[1]), driver._check_some_reported

    def reported_then_held(*args, **kwargs):
        reported(*args, **kwargs)
        hold(folder)

    driver._check_some_reported = reported_then_held
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    entry()


if __name__ == "__main__":
    main()
