"""Handle SIGTERM as Ctrl-C, so a stopped job ends a search gracefully with exit code 143."""

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
    """Restore the SIGINT and SIGTERM handlers found on entry when the block ends."""
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
    """Make SIGTERM do what Ctrl-C would do from now on."""
    if _main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


@contextlib.contextmanager
def before_start(resuming: bool) -> Iterator[None]:
    """End a search that is checking its plan in SearchInterrupted on Ctrl-C or SIGTERM."""
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
    """Take SIGTERM as Ctrl-C while Ray starts, including Ray's own exit on it."""
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
    """Make Ctrl-C raise KeyboardInterrupt again after Tune's ``fit`` returns."""
    if _main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def stop_tune() -> None:
    """Ask the running Tuner to stop as Ctrl-C does; outside Tune, raise KeyboardInterrupt."""
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
    """Hold SIGTERM back until the block ends, then only say it; Ctrl-C still interrupts."""
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
    """Return an interrupted search's exit code: 143 after SIGTERM, else 130."""
    return 128 + (signal.SIGTERM if signal.SIGTERM in _received else signal.SIGINT)
