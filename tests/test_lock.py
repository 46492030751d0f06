"""One driver per search: a second one refused with one line naming the running one (pid, host, since when), and
the lock of a driver that died (SIGKILL) taken over by the next one, with a note."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
from _commands import ray_sessions, refused
from _spaces import space_text

from vitplast_tune.lock import OWNER_FILE, SearchLock, read_owner, running_owner
from vitplast_tune.plan import SearchOptions, prepare
from vitplast_tune.run import guard

HOLD = (
    "import sys, time; from pathlib import Path; from vitplast_tune.lock import SearchLock; "
    "SearchLock(Path(sys.argv[1]), 'held').acquire(); print('held', flush=True); time.sleep(600)"
)


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of search "held" in tmp_path/results (the driver's lock, as it takes it)."""
    folder = tmp_path / "results" / "held"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc, folder
    finally:
        proc.kill()
        proc.wait(30)


def test_a_second_driver_is_refused_naming_the_running_one_and_a_dead_ones_lock_is_taken_over(
    tmp_path, capsys, holder, library_log, monkeypatch
):
    proc, folder = holder
    (tmp_path / "space.yaml").write_text(space_text())
    argv = ["--space", str(tmp_path / "space.yaml"), "--storage", str(tmp_path / "results"), "--name", "held"]
    from vitplast_tune.plan import resources

    monkeypatch.setattr(resources, "ray_running_here", lambda: False)  # a fresh command line's view
    for dry in ([], ["--dry-run"]):
        line = refused("search", [*argv, *dry], tmp_path, capsys)
        assert line.startswith(f'error: search "held" is running: its driver, pid {proc.pid} on {socket.gethostname()}')
        assert f"since {read_owner(folder).since}" in line and f"stop it (kill {proc.pid})" in line
    assert not (tmp_path / "results" / "mlflow.db").exists() and ray_sessions() == set()
    with pytest.raises(Exception, match="is running"):
        SearchLock(folder, "held").acquire()  # the driver's own take, after its checks

    os.kill(proc.pid, signal.SIGKILL)  # the driver dies; its owner file stays
    proc.wait(30)
    assert read_owner(folder).pid == proc.pid and running_owner(folder) is None
    plan = prepare(SearchOptions(space=str(tmp_path / "space.yaml"), name="held", storage=str(tmp_path / "results")))
    with guard.guarded(plan):
        assert read_owner(folder).pid == os.getpid() and running_owner(folder).pid == os.getpid()
    assert f"note: took over the lock of a driver that no longer runs (pid {proc.pid} on " in "\n".join(library_log)
    assert not (folder / OWNER_FILE).exists() and running_owner(folder) is None  # given back when the search ended


def test_a_lock_released_before_anything_was_recorded_leaves_no_folder_it_made(tmp_path):
    """A search refused after its lock was taken (e.g. a refused --address) leaves none of the folders the lock made;
    a folder that held something before, or that got a record meanwhile, stays."""
    folder = tmp_path / "storage" / "search"
    lock = SearchLock(folder, "search")
    lock.acquire()
    assert folder.is_dir()
    lock.release()
    assert not (tmp_path / "storage").exists()

    lock = SearchLock(folder, "search")
    lock.acquire()
    (folder / "vitplast_search.json").write_text("{}")
    lock.release()
    assert (folder / "vitplast_search.json").is_file()
