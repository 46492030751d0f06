"""A disk that fills under the driver, without Ray: ``vitplast search`` run in this process on a small tmpfs, with the
driver's recording and tuning replaced by a stand-in that opens the search's real MLflow runs on that disk, fills it
and fails. The search ends as a signal ends it: one line naming the full filesystem and the command that resumes it,
exit code 74, every run closed, nothing half-written; and a trial table written on the full disk, left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from _commands import search_args
from _disk import fill, small_disk
from mlflow.tracking import MlflowClient

from vitplast_tune import cli
from vitplast_tune.lock import LOCK_FILE, OWNER_FILE
from vitplast_tune.records import tracking
from vitplast_tune.records.table import write_trials
from vitplast_tune.records.tracking import PARENT_TAG, child_runs
from vitplast_tune.run import driver, guard
from vitplast_tune.storage import SEARCH_FILE, write_record


@pytest.fixture
def disk(tmp_path):
    with small_disk(tmp_path / "disk", size_mib=32) as mounted:
        yield mounted


@pytest.fixture
def no_ray_start(monkeypatch):
    """The driver finds Ray started (it starts and stops none): the stand-in below never needs it."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)


def searched(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``vitplast search argv`` in this process: its exit code and its lines on stderr."""
    with pytest.raises(SystemExit) as exited:
        cli.COMMANDS["search"](argv)
    return exited.value.code, capsys.readouterr().err.strip().splitlines()


def runs(folder: Path) -> tuple[str, list[str]]:
    """The status of the recorded search's parent run and of each trial run."""
    record = json.loads((folder / SEARCH_FILE).read_text())
    client, parent = MlflowClient(record["tracking_uri"]), record["parent_run_id"]
    return client.get_run(parent).info.status, sorted(r.info.status for r in child_runs(client, parent))


@pytest.mark.parametrize("failure", ["the driver's write", "another error"])
def test_a_disk_that_fills_under_the_driver_ends_it_as_a_signal_with_every_run_closed(
    failure, disk, tiny_space, monkeypatch, capsys, no_ray_start
):
    """The driver's own write meets the full disk, or another error (Ray's own processes dying on the same disk)
    whose closing of the runs meets it: a traceback with the parent and trial runs left RUNNING before."""

    def record_then_fill(plan, callbacks, records, timings, trainable=None):
        records.mlflow = tracking.client(plan.tracking_uri)
        records.parent = tracking.start_search_run(records.mlflow, plan.experiment, plan.name, {}, {})
        experiment = records.mlflow.get_run(records.parent).info.experiment_id
        for trial in ("t0", "t1"):
            records.mlflow.create_run(experiment, run_name=trial, tags={PARENT_TAG: records.parent})
        write_record(plan.local_dir, plan.record(records.parent))
        records.written = True
        fill(disk)
        if failure == "another error":
            raise RuntimeError("the raylet died")
        (disk / "table.csv").write_text("x" * 2**20)  # an OSError(ENOSPC) that names no file

    monkeypatch.setattr(driver, "_record_and_tune", record_then_fill)
    code, err = searched(search_args(tiny_space(), "full", disk / "results"), capsys)
    assert code == guard.EXIT_CODE and len(err) == 1, err
    assert err[0].startswith("interrupted: ") and f"(the filesystem at {disk} is full)" in err[0]
    assert "nothing is lost: free space (or fix the filesystem), then continue the search with" in err[0]
    assert err[0].endswith("--resume")
    (disk / "filler").unlink()
    folder = disk / "results" / "full"
    assert runs(folder) == ("KILLED", ["KILLED", "KILLED"])  # none RUNNING
    assert not (folder / OWNER_FILE).exists() and not (folder / guard.RESERVE_FILE).exists()
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE, SEARCH_FILE]  # no partial file beside them


def test_a_disk_full_before_the_search_takes_its_lock_is_one_line(disk, tiny_space, capsys, no_ray_start):
    """Its folder, lock or space held back on a full disk: a traceback before."""
    fill(disk)
    code, err = searched(search_args(tiny_space(), "full", disk / "results"), capsys)
    assert code == guard.EXIT_CODE and len(err) == 1, err
    assert err[0] == (
        f"interrupted: No space left on device (the filesystem at {disk} is full), while locking: stopped before its "
        "trials ended, before anything was recorded: nothing to resume; free space (or fix the filesystem), then run "
        "the same command again"
    )


def test_the_trial_table_written_on_a_full_disk_is_left_as_it_was(disk):
    """The table ``load_search`` and ``--resume`` read back: written whole or not at all (cut short before)."""
    folder = disk / "search"
    folder.mkdir()
    write_trials(pd.DataFrame({"trial_id": ["00000"], "best_val_acc": [0.5]}), folder)
    kept = (folder / "trials.csv").read_text()
    fill(disk)
    more = pd.DataFrame({"trial_id": [f"{i:05d}" for i in range(50_000)], "best_val_acc": 0.5})
    with pytest.raises(OSError) as raised:
        write_trials(more, folder)
    assert guard.fault_of(raised.value) == "No space left on device"
    assert (folder / "trials.csv").read_text() == kept and [p.name for p in folder.iterdir()] == ["trials.csv"]
