"""Allow one driver per search, with a lock in the search's folder and an owner file that names its driver."""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from vitplast_tune.errors import UserError

LOCK_FILE = ".driver.lock"  # the OS lock, an empty file left in place so no second driver races its removal
OWNER_FILE = ".driver.json"  # who holds it, written once it is held and removed when it is released


@dataclass(frozen=True)
class Owner:
    """Name the driver that holds, or held, a search's lock.

    ``since`` is when it took the lock, in local time; ``started`` is its start time in clock ticks since boot, which
    tells it from a later process of the same pid.
    """

    pid: int
    host: str
    since: str
    command: str
    started: int | None = None

    def describe(self) -> str:
        """Describe the driver for messages: ``pid 123 on host since 2026-12-01 15:30:02 (vitplast search ...)``."""
        return f"pid {self.pid} on {self.host} since {self.since} ({self.command[:120]})"

    def alive_here(self) -> bool:
        """Tell whether this driver's process still runs on this host (False for another host's driver)."""
        if self.host != socket.gethostname():
            return False
        now = _started(self.pid)
        return now != -1 and (self.started is None or now is None or now == self.started)


def read_owner(folder: Path) -> Owner | None:
    """Read the driver that a search folder's owner file names (None when there is no readable owner file)."""
    try:
        return Owner(**json.loads((Path(folder) / OWNER_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def running_owner(folder: Path) -> Owner | None:
    """Find the driver that runs a search now (None if none), writing nothing."""
    owner = read_owner(folder)
    if owner is None:
        return None
    lock = FileLock(Path(folder) / LOCK_FILE, timeout=0, preserve_lock_file=True, fallback_to_soft=False)
    try:
        lock.acquire()
    except Timeout:
        return owner
    except OSError:  # the filesystem has no locks, so the owner file decides
        return owner if owner.alive_here() or owner.host != socket.gethostname() else None
    lock.release()
    return owner if owner.alive_here() and owner.pid != os.getpid() else None


class SearchLock:
    """Hold the lock of one search's folder from ``acquire`` to ``release``; ``name`` is for messages."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder, self.name = Path(folder), name
        self._lock = FileLock(self.folder / LOCK_FILE, timeout=0, preserve_lock_file=True, fallback_to_soft=False)
        self._held = False
        self._made: list[Path] = []

    def acquire(self) -> Owner | None:
        """Take the lock, make the folder if missing, and write this driver into the owner file.

        Returns the stale owner taken over, or None. Raises UserError, naming the other driver, when one runs the
        search.
        """
        self._made = [f for f in (self.folder, *self.folder.parents) if not f.exists()]  # deepest first
        self.folder.mkdir(parents=True, exist_ok=True)
        previous = read_owner(self.folder)
        try:
            self._lock.acquire()
        except Timeout:
            raise _refusal(self.folder, self.name, previous) from None
        except OSError:
            if previous is not None and (previous.alive_here() or previous.host != socket.gethostname()):
                raise _refusal(self.folder, self.name, previous) from None
        if previous is not None and previous.alive_here() and previous.pid != os.getpid():
            self._release_lock()
            raise _refusal(self.folder, self.name, previous)
        self._held = True
        _write_owner(self.folder, _this_driver())
        return previous

    def release(self) -> None:
        """Give the lock back and remove the owner file; do nothing when it is not held."""
        if not self._held:
            return
        self._held = False
        (self.folder / OWNER_FILE).unlink(missing_ok=True)
        self._release_lock()
        self._remove_if_unused()

    def _remove_if_unused(self) -> None:
        """Remove the folders ``acquire`` made when nothing but the lock file was written in them."""
        if not self._made or any(p.name != LOCK_FILE for p in self.folder.iterdir()):
            return
        (self.folder / LOCK_FILE).unlink(missing_ok=True)
        for folder in self._made:
            try:
                folder.rmdir()
            except OSError:  # something else was written there meanwhile
                break

    def _release_lock(self) -> None:
        if self._lock.is_locked:
            self._lock.release()


def _refusal(folder: Path, name: str, owner: Owner | None) -> UserError:
    """Make the error that refuses a second driver of a search, naming the running one and how to stop it."""
    who = owner.describe() if owner else "a driver that is starting"
    kill = f" (kill {owner.pid})" if owner and owner.host == socket.gethostname() else ""
    return UserError(
        f'search "{name}" is running: its driver, {who}, holds {Path(folder) / LOCK_FILE}; wait for it to end, '
        f"stop it{kill}, or give another --name"
    )


def check_not_running(folder: Path, name: str) -> None:
    """Check that no driver runs a search now, writing nothing."""
    owner = running_owner(folder)
    if owner is not None:
        raise _refusal(folder, name, owner)


def _this_driver() -> Owner:
    return Owner(
        pid=os.getpid(),
        host=socket.gethostname(),
        since=time.strftime("%Y-%m-%d %H:%M:%S"),
        command=shlex.join([Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]]),
        started=_started(os.getpid()),
    )


def _write_owner(folder: Path, owner: Owner) -> None:
    partial = folder / f".{OWNER_FILE}.{os.getpid()}.tmp"
    partial.write_text(json.dumps(asdict(owner)))
    os.replace(partial, folder / OWNER_FILE)


def _started(pid: int) -> int | None:
    """Return a process's start time in clock ticks since boot, -1 when it is gone, None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return -1 if Path("/proc/self/stat").exists() else _exists(pid)
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name


def _exists(pid: int) -> int | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return -1
    except OSError:
        return None
    return None
