"""The test-only holds: a phase named by VITPLAST_HOLD waits there for its signal; nothing waits without it."""

import os
import signal
import threading
import time

import pytest

from vitplast_tune import holds
from vitplast_tune.run import interrupts


def test_without_the_variable_nothing_is_held(tmp_path, monkeypatch):
    monkeypatch.delenv(holds.HOLD_ENV, raising=False)
    holds.hold("end")  # returns at once
    monkeypatch.setenv(holds.HOLD_ENV, f"trials:{tmp_path}")
    holds.hold("end")  # another phase named: returns at once
    assert list(tmp_path.iterdir()) == []


def test_a_held_phase_says_so_and_waits_for_its_release(tmp_path, monkeypatch):
    monkeypatch.setenv(holds.HOLD_ENV, f"start,end:{tmp_path / 'h'}")
    done = threading.Event()
    worker = threading.Thread(target=lambda: (holds.hold("end"), done.set()))
    worker.start()
    deadline = time.monotonic() + 30
    while not (tmp_path / "h" / "end.held").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert (tmp_path / "h" / "end.held").read_text().strip() == str(os.getpid())
    assert not done.wait(0.5)  # still held: nothing released it
    (tmp_path / "h" / "end.release").touch()
    assert done.wait(10)
    worker.join()


def test_a_signal_ends_the_hold_whether_its_handler_raises_or_holds_it_back(tmp_path, monkeypatch, library_log):
    monkeypatch.setenv(holds.HOLD_ENV, f"end:{tmp_path}")
    monkeypatch.setattr(holds, "LIMIT_S", 20.0)  # a hold the signal missed ends after 20 s: the check below fails
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            holds.hold("end")
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    with interrupts.deferred():  # SIGTERM held back while the results are written: the hold ends all the same
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        started = time.monotonic()
        holds.hold("end")
        assert time.monotonic() - started < 10
    assert any("recorded them first" in line for line in library_log)


def test_a_signal_whose_handler_only_sets_a_flag_ends_the_hold_and_the_handler_still_runs(tmp_path, monkeypatch):
    """Tune's graceful stop is such a handler (SIGINT while ``fit`` runs, SIGTERM through ``interrupts``): the hold
    ends when it comes, the handler has run, and it is the signal's handler again after."""
    monkeypatch.setenv(holds.HOLD_ENV, f"checkpoint:{tmp_path}")
    monkeypatch.setattr(holds, "LIMIT_S", 20.0)  # a hold the signal missed ends after 20 s: the check below fails
    seen: list[int] = []

    def graceful(signum, frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGINT, graceful)
    try:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        started = time.monotonic()
        holds.hold("checkpoint")
        assert time.monotonic() - started < 10 and seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is graceful
    finally:
        signal.signal(signal.SIGINT, previous)
