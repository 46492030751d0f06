"""SIGTERM handled as Ctrl-C: what ``kill``, ``timeout``, Kubernetes and batch schedulers send before they stop a job
ends a search the way Ctrl-C does (Ray Tune's own graceful stop, runs closed, the resume command printed), with exit
code 143 instead of 130.

``ray.init`` installs its own SIGTERM handler (it exits at once, with status 15 and no word), so ``handled()`` is
entered before Ray starts, ``starting_ray()`` takes that exit for an interrupt while Ray starts and
``on_sigterm_interrupt()`` is called after it; all are no-ops off the main thread. Before that, while the plan is
checked, ``before_start()`` does the same. Once every trial has ended, ``deferred()`` holds SIGTERM back while the
results are recorded, so that they are whole.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from vitplast_tune.errors import SearchInterrupted
from vitplast_tune.log import get_logger

log = get_logger(__name__)

_received: list[int] = []  # the signals that interrupted the current search, in order


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Restore the SIGINT and SIGTERM handlers found on entry when the block ends (Ray and Tune replace them)."""
    if not _main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    _received.clear()
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def on_sigterm_interrupt() -> None:
    """From now on SIGTERM does what SIGINT (Ctrl-C) would do at that moment: while Tune runs, its graceful stop;
    otherwise a KeyboardInterrupt."""
    if _main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


@contextlib.contextmanager
def before_start(resuming: bool) -> Iterator[None]:
    """While a search checks its plan (nothing started, nothing recorded yet): Ctrl-C and SIGTERM end it in
    SearchInterrupted with the line and exit code (130, 143) a later interrupt has, saying whether there is something
    to resume (``resuming``: a recorded search the same command continues)."""
    if not _main_thread():
        yield
        return
    with handled():
        restore_ctrl_c()  # not a handler a Tuner fitted before in this process left, which would only set a flag
        on_sigterm_interrupt()
        try:
            yield
        except KeyboardInterrupt:
            said = "; nothing is lost: continue the search with the same command" if resuming else NOTHING_RECORDED
            again = "" if resuming else "; run the same command again"
            raise SearchInterrupted(f"stopped before its trials ended{said}{again}", exit_code()) from None


NOTHING_RECORDED = ", before anything was recorded: nothing to resume"  # after what stopped it; then what to do


@contextlib.contextmanager
def starting_ray() -> Iterator[None]:
    """While Ray starts, SIGTERM is Ctrl-C too: before ``ray.init`` installs its handler through ours, after it
    through its ``sys.exit(SIGTERM)``, taken here for a KeyboardInterrupt with SIGTERM noted (exit code 143)."""
    on_sigterm_interrupt()
    try:
        yield
    except SystemExit as exc:
        if exc.code != signal.SIGTERM or not _main_thread():
            raise
        _received.append(signal.SIGTERM)
        raise KeyboardInterrupt from None
    on_sigterm_interrupt()  # after ray.init, which installed its own SIGTERM handler


def restore_ctrl_c() -> None:
    """Ctrl-C raises KeyboardInterrupt again (Tune leaves its handler installed after ``fit`` returns)."""
    if _main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def stop_tune() -> None:
    """Ask the running Tuner to stop as Ctrl-C does (its SIGINT handler called, no signal sent): outside Tune, a
    KeyboardInterrupt."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signal.SIGINT, None)
    else:
        raise KeyboardInterrupt


def _interrupt(signum: int, frame) -> None:
    _received.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored (a background job) or left to the default: interrupt all the same
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """SIGTERM waits for the block to end (the results of a search whose trials all ended, recorded whole rather than
    cut off), then is only said: the search is complete, nothing is left to resume. Ctrl-C still interrupts."""
    if not _main_thread():
        yield
        return
    received: list[int] = []

    def hold_back(signum: int, frame) -> None:
        received.append(signum)

    saved = signal.signal(signal.SIGTERM, hold_back)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved if saved is not None else signal.SIG_DFL)
        if received:
            log.info("SIGTERM came while the search recorded its results: it recorded them first, and is complete")


def exit_code() -> int:
    """The exit code of an interrupted search: 128 + SIGTERM (143) when SIGTERM stopped it, else 130 (Ctrl-C)."""
    return 128 + (signal.SIGTERM if signal.SIGTERM in _received else signal.SIGINT)
