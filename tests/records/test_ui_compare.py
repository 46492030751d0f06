"""``vitplast ui NAME1 NAME2``: one MLflow view of several searches' trials, on their shared store: its filter selects
exactly their trial runs (no parent run, no other search's), each run's search shown as a column; searches on
different stores are refused in one line before any UI starts; the command serves the view and prints its link."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from _raycluster import cmdline, descendants
from mlflow.tracking import MlflowClient

from vitplast_tune._compat import mlflow as mlflow_internals
from vitplast_tune.errors import UserError
from vitplast_tune.records import ui
from vitplast_tune.records.view import ROLE_TAG, SEARCH_TAG
from vitplast_tune.storage import read_record, search_dir, write_record

ROOT = Path(__file__).resolve().parents[2]
SPACE = ROOT / "search_spaces" / "component_subsets.yaml"


def recorded(storage: Path, uri: str, name: str, trials: int) -> list[str]:
    """A search's MLflow runs (a parent, ``trials`` trial runs) and its record, as a search leaves them."""
    mlflow = MlflowClient(uri)
    found = mlflow.get_experiment_by_name("vitplast_tune")
    experiment = found.experiment_id if found else mlflow.create_experiment("vitplast_tune")
    parent = mlflow.create_run(experiment, tags={SEARCH_TAG: name, ROLE_TAG: "search"}).info.run_id
    ids = []
    for i in range(trials):
        tags = {SEARCH_TAG: name, ROLE_TAG: "trial", "mlflow.parentRunId": parent}
        run = mlflow.create_run(experiment, tags=tags)
        mlflow.log_metric(run.info.run_id, "val_acc_common", 0.5 + i / 10)
        mlflow.set_terminated(run.info.run_id)
        ids.append(run.info.run_id)
    record = {"name": name, "space_path": str(SPACE), "fingerprint": "x", "tracking_uri": uri, "settings": {}}
    write_record(storage / name, {**record, "parent_run_id": parent, "experiment": "vitplast_tune"})
    return ids


@pytest.fixture
def searches(tmp_path):
    storage, uri = tmp_path / "results", f"sqlite:///{tmp_path / 'mlflow.db'}"
    ids = {name: recorded(storage, uri, name, n) for name, n in (("a", 2), ("b", 3), ("other", 2))}
    recorded(storage, f"sqlite:///{tmp_path / 'elsewhere.db'}", "far", 1)
    return storage, uri, ids


def test_one_view_shows_exactly_the_trials_of_the_searches_named(searches):
    storage, uri, ids = searches
    records = [read_record(search_dir(n, storage), purpose="recorded") for n in ("a", "b")]
    link = ui.compared(["a", "b"], records)
    mlflow = MlflowClient(uri)
    experiment = mlflow.get_experiment_by_name("vitplast_tune")
    query = parse_qs(urlsplit(link).fragment.split("?", 1)[1])
    if mlflow_internals.view_supported():
        (key,) = query["viewStateShareKey"]
        state = json.loads(json.loads(experiment.tags[mlflow_internals.VIEW_TAG_PREFIX + key])["state"])
        runs_filter = state["searchFilter"]
        assert state["selectedColumns"][0] == f"tags.`{SEARCH_TAG}`"
    else:
        (runs_filter,) = query["searchFilter"]
    shown = mlflow.search_runs([experiment.experiment_id], runs_filter)
    assert sorted(r.info.run_id for r in shown) == sorted(ids["a"] + ids["b"])


def test_searches_on_different_stores_are_refused_before_any_ui_starts(searches):
    storage, _, _ = searches
    with pytest.raises(UserError, match="the searches record to different MLflow tracking stores"):
        ui.serve(["a", "far"], str(storage))
    proc = subprocess.run(
        [sys.executable, "-m", "vitplast_tune", "ui", "a", "far", "--storage", str(storage)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: the searches record to different MLflow")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_command_serves_one_view_of_several_searches(searches):
    storage, _, _ = searches
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serving = subprocess.Popen(
        [sys.executable, "-m", "vitplast_tune", "ui", "a", "b", "--storage", str(storage), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines, deadline = [], time.time() + 300
        while time.time() < deadline and not any("MLflow UI on http://" in line for line in lines):
            line = serving.stdout.readline()
            if not line and serving.poll() is not None:
                break
            lines.append(line)
        said = "".join(lines)
        assert f"MLflow view of a, b: http://127.0.0.1:{port}/#/experiments/" in said, said
        assert f"MLflow UI on http://127.0.0.1:{port}" in said, said
        # MLflow's job runner is launched before its server answers, so its absence here is no race.
        serving_tree = [cmdline(pid) for pid in descendants(serving.pid)]
        assert not [c for c in serving_tree if "mlflow.server.jobs" in c], serving_tree
    finally:
        serving.terminate()
        serving.wait(timeout=60)
