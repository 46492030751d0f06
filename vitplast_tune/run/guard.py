"""Guard a running search: one driver, disk space held back, and an OS fault or a silent tracking store as an interrupt.

The search then stops gracefully, closes its runs and prints how to resume, with exit code 74 or 69.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ray.tune import Callback

from vitplast_tune._compat import mlflow as mlflow_internals
from vitplast_tune._compat import ray_tune
from vitplast_tune.errors import trial_cause
from vitplast_tune.lock import SearchLock
from vitplast_tune.log import get_logger
from vitplast_tune.plan.search_plan import SearchPlan
from vitplast_tune.records import tracking
from vitplast_tune.run import interrupts

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = get_logger(__name__)

EXIT_CODE = 74  # sysexits' EX_IOERR: an error while doing I/O on some file
SERVICE_EXIT_CODE = 69  # sysexits' EX_UNAVAILABLE: a service the search needs does not answer
OS_FIX = "free space (or fix the filesystem), then "
SERVICE_FIX = "start the MLflow tracking server (or its database) again, then "
RESERVE_FILE = ".reserve"  # the space held back, in the search's folder (and beside a SQLite store elsewhere)
RESERVE_BYTES = 16 * 2**20  # enough to write Tune's state of a few thousand trials again and close the runs
FAULT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG, errno.ENFILE, errno.EMFILE}
FAULT_TEXTS = (  # the same errors as other layers word them (SQLite, pyarrow, a trial's error text)
    "No space left on device",
    "Disk quota exceeded",
    "Read-only file system",
    "Input/output error",
    "File too large",
    "Too many open files",
    "database or disk is full",
    "disk I/O error",
    "attempt to write a readonly database",
)


def fault_of(error: BaseException | str | None) -> str | None:
    """Describe the OS fault behind ``error`` or its causes, with the file it hit; None for another kind."""
    seen: set[int] = set()
    while isinstance(error, BaseException) and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in FAULT_ERRNOS:
            where = f" ({error.filename})" if error.filename else ""
            return f"{error.strerror or os.strerror(error.errno)}{where}"
        text = _matching_text(str(error))
        if text:
            return text
        error = error.__cause__ or error.__context__
    return _matching_text(error) if isinstance(error, str) else None


# An MLflow call that got no answer, as MLflow's REST client (requests, urllib3) and SQLAlchemy's drivers word it.
SERVICE_TEXTS = (
    "Max retries exceeded",
    "Read timed out",
    "Connection refused",
    "Connection reset by peer",
    "Connection aborted",
    "RemoteDisconnected",
    "server closed the connection unexpectedly",
    "could not connect to server",
    "connection to server",
)
_SERVICE_MODULES = ("mlflow", "requests", "urllib3", "sqlalchemy", "psycopg", "pymysql", "MySQLdb")


def _service_fault_of(error: BaseException | None) -> str | None:
    """Describe the tracking store's failure to answer behind ``error``; None for another kind."""
    seen: set[int] = set()
    while isinstance(error, BaseException) and id(error) not in seen:
        seen.add(id(error))
        if type(error).__module__.split(".")[0] in _SERVICE_MODULES:
            text = str(error)
            for words in SERVICE_TEXTS:
                if words in text:
                    return f"the MLflow tracking store did not answer ({words})"
        error = error.__cause__ or error.__context__
    return None


FULL_TEXTS = ("No space left on device", "database or disk is full")  # the faults of a full filesystem
FULL_BYTES = 2**20  # a filesystem with less free than this counts as the full one


def named_fault(error: BaseException | str | None, folders: Sequence[Path]) -> str | None:
    """Describe ``fault_of(error)``, naming the full filesystem among ``folders`` when no file is named."""
    fault = fault_of(error)
    for folder in folders if fault in FULL_TEXTS else ():
        try:
            path = next(p for p in (Path(folder).absolute(), *Path(folder).absolute().parents) if p.exists())
            found, device = os.statvfs(path), path.stat().st_dev
            while path != path.parent and path.parent.stat().st_dev == device:
                path = path.parent
        except OSError:
            continue
        if found.f_bavail * found.f_frsize < FULL_BYTES:
            return f"{fault} (the filesystem at {path} is full)"
    return fault


def _matching_text(text: str) -> str | None:
    for words in FAULT_TEXTS:
        if words in text:
            return words
    return None


class Reserve:
    """Hold disk space back in a file per filesystem, freed when an OS fault stops the search."""

    def __init__(self, folders: Sequence[Path], size: int = RESERVE_BYTES):
        self.files: list[Path] = []
        devices: set[int] = set()
        for folder in folders:
            if folder.stat().st_dev in devices:
                continue
            devices.add(folder.stat().st_dev)
            path = folder / RESERVE_FILE
            try:
                with open(path, "wb") as f:
                    os.posix_fallocate(f.fileno(), 0, size) if hasattr(os, "posix_fallocate") else f.truncate(size)
            except OSError as exc:
                path.unlink(missing_ok=True)
                log.warning(f"warning: could not hold back {size // 2**20} MiB in {folder} ({exc.strerror})")
                continue
            self.files.append(path)

    def free(self) -> None:
        """Give the space back; a second call does nothing."""
        for path in self.files:
            path.unlink(missing_ok=True)
        self.files = []


class Watch(Callback):
    """Take the search's first OS fault: stop Tune as Ctrl-C does, quiet its failing saves, and rewrite its state."""

    def __init__(self):
        self.fault: str | None = None
        self.service = False  # the fault is the tracking store's (it stopped answering), not the disk's
        self.staging: Path | None = None  # Tune's own copy of its state files, on the driver's disk
        self.storage = None  # (pyarrow filesystem, path) of the search in its storage
        self.reserve = Reserve([])  # the space held back (``guarded``)
        self.folders: list[Path] = []  # the search's folder and its SQLite store's: a full disk may be either

    def __getstate__(self) -> dict:
        return {
            "fault": None,
            "service": False,
            "staging": None,
            "storage": None,
            "reserve": Reserve([]),
            "folders": [],
        }

    def take(self, error: BaseException | str | None, where: str, service: bool = False) -> bool:
        """Take ``error`` as the search's fault when it is an OS fault, or a silent store with ``service``."""
        fault = named_fault(error, self.folders)
        down = _service_fault_of(error) if fault is None and service and isinstance(error, BaseException) else None
        if fault is None and down is None:
            return False
        if self.fault is None:
            self.fault, self.service = f"{fault or down}, while {where}", down is not None
        return True

    def report(self, error: BaseException | str | None, where: str, service: bool = False) -> bool:
        """Take ``error`` and, on the first fault, ask the running Tuner to stop and say so."""
        first = self.fault is None
        taken = self.take(error, where, service)
        if taken and first:
            log.warning(f"warning: {self.fault}: stopping the search")
            interrupts.stop_tune()
        return taken

    def _remember(self, trial) -> None:
        if self.staging is None and trial is not None:
            self.staging, self.storage = ray_tune.experiment_paths(trial)

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        self._remember(trial)

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        self._remember(trial)

    def on_trial_recover(self, iteration: int, trials: list, trial, **info) -> None:
        self.report(ray_tune.trial_error_text(trial), f"trial {trial.trial_id} ran")

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        self.report(ray_tune.trial_error_text(trial), f"trial {trial.trial_id} ran")

    def filter(self, record: logging.LogRecord) -> bool:
        """Take and hide a Tune log record of a failure that is an OS fault or a raced upload."""
        error = record.exc_info[1] if record.exc_info else None
        if ray_tune.renamed_while_uploaded(error or record.getMessage()):
            log.debug("Tune's upload of its state met a file its next save had renamed; the next upload carries it")
            return False
        what = record.getMessage().splitlines()[0][:100].rstrip(": ") if error is not None else ""
        return error is None or not self.report(error, f"Tune reported: {what}")

    def rewrite_state(self) -> None:
        """Write Tune's experiment files into a local storage again, each whole, from Tune's staging copy."""
        if self.staging is None or self.storage is None or not self.staging.is_dir():
            return
        fs, root = self.storage
        if fs.type_name != "local":
            return  # an object store replaces an object whole or not at all
        for path in sorted(p for p in self.staging.rglob("*") if p.is_file()):
            target = Path(root) / path.relative_to(self.staging)
            if target.parent.is_dir():
                partial = target.parent / f".{target.name}.rewrite"
                shutil.copyfile(path, partial)
                os.replace(partial, target)


class _Watched(Callback):
    """Wrap a callback so that its OS faults become the search's fault instead of an exception out of Tune."""

    def __init__(self, inner: Callback, watch: Watch):
        self.inner, self.watch = inner, watch

    def get_state(self):
        return self.inner.get_state()

    def set_state(self, state) -> None:
        self.inner.set_state(state)


def _delegate(hook: str):
    def call(self, *args, **kwargs):
        if self.watch.fault is not None and hook != "setup":
            return None  # the search is stopping on a full (or failing) disk: nothing more is written
        try:
            return getattr(self.inner, hook)(*args, **kwargs)
        except Exception as exc:
            if not self.watch.report(exc, f"{type(self.inner).__name__} wrote ({hook})", service=True):
                raise
            return None

    call.__name__ = hook
    return call


for _hook in [name for name in vars(Callback) if name.startswith("on_")] + ["setup"]:
    setattr(_Watched, _hook, _delegate(_hook))

_current: Watch | None = None  # the watch of the search this process runs


def watched(callbacks: Sequence[Callback]) -> list[Callback]:
    """Wrap ``callbacks`` so their OS faults are watched, and add the watch of the search that runs now."""
    if _current is None:
        return list(callbacks)
    return [_Watched(c, _current) for c in callbacks] + [_current]


def stopped_by(error: BaseException, where: str) -> bool:
    """Tell whether ``error`` out of the driver is an OS fault, or came while the search stopped on one."""
    return _current is not None and (_current.fault is not None or _current.take(error, where, service=True))


def closed_as_failed(mlflow: MlflowClient, parent: str | None, error: BaseException) -> bool:
    """Close the runs of a search that failed with ``error``: its trials KILLED, its parent FAILED.

    ``parent`` None closes nothing. Returns False when the closing met an OS fault, taken as the search's.
    """
    if parent is None:
        return True
    try:
        tracking.close_trials(mlflow, parent, "KILLED")
        tracking.mark_failed(mlflow, parent, error)
    except Exception as exc:
        if not stopped_by(exc, f"the driver closed its MLflow runs after {trial_cause(error)}"):
            raise
        return False
    return True


def close_stopped(mlflow: MlflowClient | None, parent: str | None) -> None:
    """Close a stopped search's runs as KILLED, for ``--resume`` to reopen, once Tune's state is whole."""
    _after_stop()
    if parent is None or mlflow is None:
        return
    try:
        with tracking.bounded_calls(retries=0, timeout_s=5):  # a tracking store that stopped answering: once
            tracking.close_search(mlflow, parent, "KILLED")
    except Exception as exc:
        if not stopped_by(exc, "the driver closed its MLflow runs"):
            raise
        why = fault_of(exc) or _service_fault_of(exc) or current_fault()
        log.warning(f"warning: the MLflow runs stay RUNNING ({why}): --resume closes them")


def current_fault() -> str | None:
    """Return the fault that stopped the search running now, or None."""
    return _current.fault if _current is not None else None


def current_fix() -> tuple[str, int]:
    """Return what to do about the current fault before resuming, and the exit code it ends with."""
    if _current is not None and _current.service:
        return SERVICE_FIX, SERVICE_EXIT_CODE
    return OS_FIX, EXIT_CODE


@contextlib.contextmanager
def guarded(plan: SearchPlan) -> Iterator[Watch]:
    """Make the search's folders, hold its lock, keep space back and watch its OS faults while the block runs."""
    global _current
    folder = plan.local_dir or plan.results_dir
    lock = SearchLock(folder, plan.name)
    stale = lock.acquire()
    if stale is not None:
        log.info(f"note: took over the lock of a driver that no longer runs ({stale.describe()})")
    watch, loggers = Watch(), [logging.getLogger(name) for name in ray_tune.FAILURE_LOGGERS]
    database = logging.getLogger(mlflow_internals.DATABASE_ERROR_LOGGER)  # its traceback of a full disk: not shown
    try:
        watch.folders = [folder, *_store_folders(plan.tracking_uri)]
    except OSError:
        lock.release()  # the store's folder cannot be made (a full disk): the caller says so
        raise
    watch.reserve = Reserve(watch.folders)
    _current = watch
    for logger in loggers:
        logger.addFilter(watch)
    database.addFilter(_not_a_fault)
    try:
        yield watch
    finally:
        for logger in loggers:
            logger.removeFilter(watch)
        database.removeFilter(_not_a_fault)
        _current = None
        watch.reserve.free()
        lock.release()


def _not_a_fault(record: logging.LogRecord) -> bool:
    """Hide a log record of an error that is an OS fault; the search says it in one line."""
    return fault_of(record.exc_info[1] if record.exc_info else record.getMessage()) is None


def _after_stop(watch: Watch | None = None) -> None:
    """Free the held-back space and write Tune's state again whole, once Tune has stopped on an OS fault."""
    watch = watch or _current
    if watch is None or watch.fault is None:
        return
    watch.reserve.free()
    try:
        watch.rewrite_state()
    except OSError as exc:
        log.warning(f"warning: Tune's state could not be written again ({exc.strerror})")


def _store_folders(tracking_uri: str) -> list[Path]:
    """Return the folder of a local SQLite MLflow store, made if missing."""
    if not tracking_uri.startswith("sqlite:///"):
        return []
    database = tracking_uri.split(":///", 1)[1].split("?")[0]
    if not database or database == ":memory:":
        return []
    folder = Path(database).expanduser().parent
    folder.mkdir(parents=True, exist_ok=True)
    return [folder]
