"""OS faults while a search runs (``run.guard``), from a real full device (/dev/full): told apart from other errors,
taken from a callback or a Tune log record instead of an exception out of Tune, Tune asked to stop once."""

from __future__ import annotations

import logging
import signal
import sqlite3

import pytest
from ray.tune import Callback

from vitplast_tune._compat import ray_tune
from vitplast_tune.run import guard


def full_device_error() -> OSError:
    """The error of a write to a full device, for real (Linux's /dev/full)."""
    try:
        with open("/dev/full", "wb") as f:
            f.write(b"x")
    except OSError as exc:
        return exc
    raise AssertionError("/dev/full took a write")


def wrapped(outer: type, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer(f"{type(exc).__name__}: while logging") from exc
    except BaseException as exc:
        return exc


def test_os_faults_are_told_apart_from_other_errors():
    full = full_device_error()
    assert guard.fault_of(full) == "No space left on device"
    assert guard.fault_of(wrapped(RuntimeError, sqlite3.OperationalError("database or disk is full"))) == (
        "database or disk is full"
    )  # as MLflow wraps SQLite's
    assert guard.fault_of("ray::ImplicitFunc.train()\nOSError: [Errno 28] No space left on device") is not None
    assert guard.fault_of(wrapped(RuntimeError, ValueError("bad value"))) is None
    assert guard.fault_of(PermissionError(13, "Permission denied")) is None
    assert guard.fault_of(None) is None


class Writes(Callback):
    def __init__(self, error: BaseException | None):
        self.error, self.calls = error, 0

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.calls += 1
        if self.error is not None:
            raise self.error


@pytest.fixture
def tune_stop(monkeypatch):
    """Tune's SIGINT handler as ``fit`` installs it: the calls it got."""
    calls = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    yield calls
    signal.signal(signal.SIGINT, previous)


def test_a_callbacks_os_fault_stops_tune_once_and_other_errors_still_raise(monkeypatch, tune_stop):
    watch = guard.Watch()
    monkeypatch.setattr(guard, "_current", watch)
    failing, other = Writes(full_device_error()), Writes(ValueError("a bug"))
    wrapped_failing, wrapped_other, last = guard.watched([failing, other])
    assert last is watch and guard.current_fault() is None
    wrapped_failing.on_trial_result(iteration=1, trials=[], trial=None, result={})  # no exception out of Tune
    assert guard.current_fault() == "No space left on device, while Writes wrote (on_trial_result)"
    assert tune_stop == [signal.SIGINT]
    wrapped_failing.on_trial_result(iteration=2, trials=[], trial=None, result={})
    assert failing.calls == 1 and tune_stop == [signal.SIGINT]  # nothing more written, Tune asked once

    monkeypatch.setattr(guard, "_current", guard.Watch())
    with pytest.raises(ValueError, match="a bug"):
        guard.watched([other])[0].on_trial_result(iteration=1, trials=[], trial=None, result={})


def test_tunes_failed_save_of_its_state_is_taken_and_not_shown(monkeypatch, tune_stop):
    watch, seen = guard.Watch(), []
    logger = logging.getLogger(ray_tune.FAILURE_LOGGERS[0])
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    logger.addFilter(watch)
    try:
        logger.error("Saving experiment state to storage failed with exception: ", exc_info=full_device_error())
        logger.error("Another failure", exc_info=ValueError("not an OS fault"))
    finally:
        logger.removeFilter(watch)
        logger.removeHandler(handler)
    assert [r.getMessage() for r in seen] == ["Another failure"]
    assert watch.fault.startswith("No space left on device, while Tune reported: Saving experiment")
    assert tune_stop == [signal.SIGINT]


def missing_copy_error(path) -> FileNotFoundError:
    """pyarrow's error, for real, when a file its upload listed is gone as it opens it (as Ray's upload copies)."""
    import pyarrow.fs

    local = pyarrow.fs.LocalFileSystem()
    try:
        pyarrow.fs.copy_files(str(path), str(path) + ".copy", source_filesystem=local, destination_filesystem=local)
    except FileNotFoundError as exc:
        return exc
    raise AssertionError(f"{path} was copied")


def test_an_upload_that_raced_tunes_next_save_is_not_shown(tmp_path, tune_stop):
    """Tune saves its state to a temporary file and renames it while the previous save's upload may still copy the
    folder: that upload's failure on the renamed file is not shown, as Tune logs it (the exception attached) and as
    Ray's syncer does (the traceback as text); a missing file of another name still is, and neither is a fault."""
    import traceback

    watch, seen = guard.Watch(), []
    handler = logging.Handler()
    handler.emit = seen.append
    temporary = tmp_path / "driver_artifacts" / ".e95105d2-2c7c-497d-beb1-9576df8ba059-tmp-basic-variant-state-x.json"
    raced, other = missing_copy_error(temporary), missing_copy_error(tmp_path / "experiment_state-x.json")
    try:
        raise raced
    except FileNotFoundError:
        as_text = f"Last sync command failed with the following error:\n{traceback.format_exc()}"
    loggers = [logging.getLogger(name) for name in (ray_tune.FAILURE_LOGGERS[0], ray_tune.FAILURE_LOGGERS[-1])]
    for logger in loggers:  # Tune's save of its state, Ray's syncer
        logger.addHandler(handler)
        logger.addFilter(watch)
    try:
        loggers[0].error("Saving experiment state to storage failed with exception: ", exc_info=raced)
        loggers[1].warning(as_text)
        loggers[0].error("Saving experiment state to storage failed with exception: ", exc_info=other)
    finally:
        for logger in loggers:
            logger.removeFilter(watch)
            logger.removeHandler(handler)
    assert [r.exc_info[1] if r.exc_info else r.getMessage() for r in seen] == [other]
    assert watch.fault is None and tune_stop == []


def test_the_space_held_back_is_there_until_freed(tmp_path):
    reserve = guard.Reserve([tmp_path, tmp_path], size=2**20)  # one file per filesystem
    assert (
        reserve.files == [tmp_path / guard.RESERVE_FILE]
        and (tmp_path / guard.RESERVE_FILE).stat().st_blocks * 512 >= 2**20
    )
    reserve.free()
    assert not (tmp_path / guard.RESERVE_FILE).exists() and reserve.files == []
