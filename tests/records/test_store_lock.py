"""One new SQLite tracking store opened by several processes at once (two searches started together): MLflow makes
its schema in each, and without the lock beside the store all but one fail ("table ... already exists", an alembic
revision not found); with it each process opens the store in turn and all of them record."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

OPEN_TOGETHER = """
import sys, time
from pathlib import Path
from vitplast_tune.records import tracking
uri, ready, go, name = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
ready.touch()  # mlflow imported: waiting for the others
while not go.exists():
    time.sleep(0.001)
client = tracking.client(uri)
tracking.experiment_id(client, "shared")
print(client.create_run(tracking.experiment_id(client, "shared"), run_name=name).info.run_id)
"""


@pytest.mark.slow  # a child process or a server of its own
def test_processes_opening_one_new_sqlite_store_together_all_record(tmp_path):
    for attempt in range(3):  # each a new store: the race lost once in three would show
        store = tmp_path / f"store{attempt}" / "mlflow.db"
        uri, go = f"sqlite:///{store}", tmp_path / f"go{attempt}"
        ready = [tmp_path / f"ready{attempt}-{i}" for i in range(3)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPEN_TOGETHER, uri, str(r), str(go), f"search{i}"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i, r in enumerate(ready)
        ]
        deadline = time.monotonic() + 300
        while not all(r.exists() for r in ready):  # all three wait at the line: then they start together
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        go.touch()
        outs = [p.communicate(timeout=300) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
        assert (store.parent / "mlflow.db.lock").exists()  # the lock beside the store

        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("shared").experiment_id])
        assert sorted(r.info.run_name for r in runs) == ["search0", "search1", "search2"]
    assert Path(store).is_file()
