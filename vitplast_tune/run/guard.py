"""A running search guarded against the world: one driver per search (``lock``), a little disk space held back, and
an OS error while it runs (a full disk, a quota, a read-only or failing filesystem, no file handles left) taken as an
interrupt: Tune's graceful stop, then its runs closed and the command that resumes it printed, with exit code 74
(``EX_IOERR``), not a traceback with runs left RUNNING. So is an MLflow tracking store that stops answering while
the search runs (a stopped or stalled server or database: ``service_fault_of``), with exit code 69
(``EX_UNAVAILABLE``); its calls are bounded meanwhile (``records.tracking.BOUNDED_ENV``): a server restarted within
about a minute is ridden out, one that stays away is noticed at the first call that meets it within about two.

The error may come from any writer on the driver: the MLflow tracker and Tune's loggers (callbacks, each wrapped by
``watched``), Tune's own save of its experiment state (logged, not raised: a filter on its loggers sees it), a
trial's checkpoint (the trial errors: ``Watch.on_trial_recover``), the driver's own calls (``fault_of`` in the
driver) or the closing of the runs of a search that failed otherwise (``closed_as_failed``: Ray's own processes may
die on the same full disk). A full filesystem is named by its mount point (``full_filesystem``). When Tune has stopped, the space held back is freed, Tune's state files are written again from the driver's
copy (its in-place upload may have truncated them on the full disk) and the runs are closed.
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
    """The OS fault (``FAULT_ERRNOS``) behind ``error`` or its causes, in a few words with the file it hit; None when
    the error is of another kind."""
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


def service_fault_of(error: BaseException | None) -> str | None:
    """The tracking store's failure to answer behind ``error`` (an MLflow call, or its causes, that got no answer
    from the server or database), in a few words; None when the error is of another kind.

    Args:
        error: an exception raised by an MLflow call.

    Returns:
        E.g. ``"the MLflow tracking store did not answer (Connection refused)"``, or None.
    """
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
    """``fault_of(error)``, with the mount point of the full filesystem among ``folders`` (less than ``FULL_BYTES``
    free, as a user sees it) when the fault is a full one that names no file: the device to free."""
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
    """Disk space held back in a file per filesystem, freed when an OS fault stops the search."""

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
        """Give the space back (idempotent)."""
        for path in self.files:
            path.unlink(missing_ok=True)
        self.files = []


class Watch(Callback):
    """The search's OS fault, first one wins: asks Tune to stop as Ctrl-C does, quiets Tune's failing saves, and
    knows where Tune keeps its state (from the trials it sees), to write it again after the stop."""

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
        """Take ``error`` (met ``where``) as the search's fault when it is an OS fault (or, ``service``: an MLflow
        call met it, the tracking store's failure to answer); True when it is one."""
        fault = named_fault(error, self.folders)
        down = service_fault_of(error) if fault is None and service and isinstance(error, BaseException) else None
        if fault is None and down is None:
            return False
        if self.fault is None:
            self.fault, self.service = f"{fault or down}, while {where}", down is not None
        return True

    def report(self, error: BaseException | str | None, where: str, service: bool = False) -> bool:
        """``take``, and ask the running Tuner to stop on the first fault (as Ctrl-C does), saying so: its trials take
        a while to stop (the driver's own faults are said once, in the line that ends the search)."""
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
        """A logging filter on Tune's loggers of failures (a save of its state, a trial): one that is an OS fault is
        taken, and not shown; nor is an upload that raced Tune's next save (``ray_tune.renamed_while_uploaded``)."""
        error = record.exc_info[1] if record.exc_info else None
        if ray_tune.renamed_while_uploaded(error or record.getMessage()):
            log.debug("Tune's upload of its state met a file its next save had renamed; the next upload carries it")
            return False
        what = record.getMessage().splitlines()[0][:100].rstrip(": ") if error is not None else ""
        return error is None or not self.report(error, f"Tune reported: {what}")

    def rewrite_state(self) -> None:
        """The driver's files of the experiment (Tune's state, each trial's results and errors) written again into
        the search's storage from Tune's staging copy, each whole (a temporary file renamed), where the storage is a
        local or shared path: Tune's upload writes them in place, and a full disk leaves them cut short."""
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


class Watched(Callback):
    """A callback whose OS faults are the search's fault (``Watch.report``) instead of an exception out of Tune."""

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
    setattr(Watched, _hook, _delegate(_hook))

_current: Watch | None = None  # the watch of the search this process runs


def watched(callbacks: Sequence[Callback]) -> list[Callback]:
    """``callbacks`` with their OS faults watched, and the watch itself, for the search that runs now (as they are
    when none runs: a Tuner built outside ``guarded``)."""
    if _current is None:
        return list(callbacks)
    return [Watched(c, _current) for c in callbacks] + [_current]


def stopped_by(error: BaseException, where: str) -> bool:
    """Whether ``error``, raised out of the search's driver ``where``, is an OS fault (taken as the search's), or came
    while the search stopped on one (a file the full disk left empty, say)."""
    return _current is not None and (_current.fault is not None or _current.take(error, where, service=True))


def closed_as_failed(mlflow: MlflowClient, parent: str | None, error: BaseException) -> bool:
    """Close the runs of a search that failed with ``error`` (not an OS fault): its trials KILLED, its parent FAILED.

    Args:
        mlflow: The MLflow client of its tracking store.
        parent: Its parent run (None: none was opened, nothing to close).
        error: Why it failed, recorded on the parent run.

    Returns:
        False when the closing met an OS fault (the disk the failure filled, say), taken as the search's: the driver
        then ends the search as it does on one; True otherwise.
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
    """Close the runs of a search stopped before its trials ended as KILLED (``--resume`` reopens them), once Tune's
    state is whole again after an OS fault (``after_stop``); a store that cannot take it leaves them to ``--resume``.

    Args:
        mlflow: The MLflow client of its tracking store.
        parent: Its parent run (None: none was opened, nothing to close).
    """
    after_stop()
    if parent is None or mlflow is None:
        return
    try:
        with tracking.bounded_calls(retries=0, timeout_s=5):  # a tracking store that stopped answering: once
            tracking.close_search(mlflow, parent, "KILLED")
    except Exception as exc:
        if not stopped_by(exc, "the driver closed its MLflow runs"):
            raise
        why = fault_of(exc) or service_fault_of(exc) or current_fault()
        log.warning(f"warning: the MLflow runs stay RUNNING ({why}): --resume closes them")


def current_fault() -> str | None:
    """The OS fault (or the tracking store's failure to answer) that stopped the search running now, or None."""
    return _current.fault if _current is not None else None


def current_fix() -> tuple[str, int]:
    """What to do about the current fault before resuming (the start of a sentence) and the exit code it ends with."""
    if _current is not None and _current.service:
        return SERVICE_FIX, SERVICE_EXIT_CODE
    return OS_FIX, EXIT_CODE


@contextlib.contextmanager
def guarded(plan: SearchPlan) -> Iterator[Watch]:
    """The search's folders made, its lock held, space held back and its OS faults watched while the block runs."""
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
    """A logging filter: a record of an error that is an OS fault is not shown (the search says it in one line)."""
    return fault_of(record.exc_info[1] if record.exc_info else record.getMessage()) is None


def after_stop(watch: Watch | None = None) -> None:
    """Once Tune has stopped on an OS fault: the held-back space freed and Tune's state written again whole."""
    watch = watch or _current
    if watch is None or watch.fault is None:
        return
    watch.reserve.free()
    try:
        watch.rewrite_state()
    except OSError as exc:
        log.warning(f"warning: Tune's state could not be written again ({exc.strerror})")


def _store_folders(tracking_uri: str) -> list[Path]:
    """The folder of a local SQLite MLflow store (made if missing), for the space held back beside it."""
    if not tracking_uri.startswith("sqlite:///"):
        return []
    database = tracking_uri.split(":///", 1)[1].split("?")[0]
    if not database or database == ":memory:":
        return []
    folder = Path(database).expanduser().parent
    folder.mkdir(parents=True, exist_ok=True)
    return [folder]
