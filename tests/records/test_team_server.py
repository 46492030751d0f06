"""A team's tracking server, for real: ``mlflow server`` on PostgreSQL with its artifacts in S3 (moto), all on
127.0.0.1, two searches at once from two drivers into it, and the server restarted while one of them runs; every
trial run, metric and artifact is there once, the artifacts are in the bucket, and the best model loads from
``runs:/``. docs/cluster.md shows this deployment."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from _raycluster import MotoS3, OwnedRay
from _services import MlflowServer, Postgres, postgres_bin
from _spaces import space_text
from mlflow.tracking import MlflowClient

from vitplast_tune.records.tracking import TRIAL_TAG, child_runs, find_search_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]
SUBSETS = ["mha", "fc1", "ln1"]
EXPERIMENT = "team"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if postgres_bin("initdb") is None:
        pytest.skip("needs PostgreSQL's programs (Debian's postgresql package, which .ci/run installs)")
    pytest.importorskip("psycopg", reason="needs psycopg (the dev extra)")
    root = tmp_path_factory.mktemp("team")
    database, s3 = Postgres(), MotoS3(root / "moto")
    try:
        mlflow_server = MlflowServer(database.url, s3, "mlflow", root)
        mlflow_server.s3 = s3
        yield mlflow_server
        mlflow_server.stop()
    finally:
        s3.stop()
        database.stop()


def search(owned: OwnedRay, space: Path, name: str, storage: Path, tracking_uri: str, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, str(ROOT / "scripts" / "search.py"), "--space", str(space), "--name", name]
    cmd += ["--storage", str(storage), "--tracking-uri", tracking_uri, "--experiment", EXPERIMENT]
    cmd += ["--no-plasticity", "--max-concurrent", "1", "--quiet"]
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=owned.env, start_new_session=True)


def finished_trials(client: MlflowClient, name: str) -> int:
    """How many trial runs of search ``name`` the server holds as FINISHED (0 before its parent run exists)."""
    parent = find_search_run(client, EXPERIMENT, name)
    return 0 if parent is None else sum(r.info.status == "FINISHED" for r in child_runs(client, parent))


def test_two_searches_at_once_into_postgres_and_s3_through_a_server_restart(server, tmp_path):
    space = tmp_path / "grid.yaml"
    space.write_text(
        space_text(parameters={"components": {"choice": SUBSETS}}, defaults={"max_steps": 24, "eval_every": 8})
    )
    rays, procs = [OwnedRay(), OwnedRay()], {}
    try:
        for owned, name in zip(rays, ("alice", "bob")):
            procs[name] = search(owned, space, name, tmp_path / name, server.url, tmp_path / f"{name}.log")
        client = MlflowClient(server.url)
        deadline = time.time() + 600
        while finished_trials(client, "alice") < 1:  # one trial of alice's has ended, the others still to come
            assert time.time() < deadline and procs["alice"].poll() is None, (tmp_path / "alice.log").read_text()
            time.sleep(1)
        restarting = time.time()
        server.restart()
        took = time.time() - restarting  # within the minute of refusals MLflow's bounded calls ride out
        assert procs["alice"].poll() is None, f"restart took {took:.0f} s:\n" + (tmp_path / "alice.log").read_text()
        for name, proc in procs.items():
            assert proc.wait(timeout=900) == 0, (tmp_path / f"{name}.log").read_text()
    finally:
        for owned in rays:
            owned.kill_all()
    assert server.starts == 2

    keys = server.s3.keys("mlflow/")
    for name in ("alice", "bob"):
        parent = find_search_run(client, EXPERIMENT, name)
        run = client.get_run(parent)
        assert run.info.status == "FINISHED" and run.data.metrics["num_trials"] == 3
        children = child_runs(client, parent)
        assert sorted(r.data.params["components"] for r in children) == sorted(SUBSETS)  # each trial once
        assert len({r.data.tags[TRIAL_TAG] for r in children}) == 3
        for child in children:
            assert child.info.status == "FINISHED"
            for metric in ("val_acc", "train_loss"):
                steps = [m.step for m in client.get_metric_history(child.info.run_id, metric)]
                assert steps == [8, 16, 24], (name, metric, steps)  # every report, once
            assert len(client.get_metric_history(child.info.run_id, "best_val_loss")) == 1
        logged = {a.path for a in client.list_artifacts(parent)}
        assert {"trials.csv", "trials.json", "best_trial", "analysis", "timings.json"} <= logged
        experiment = run.info.experiment_id
        for path in ("trials.csv", "best_trial/trainable_weights.safetensors", "best_trial/trial.json"):
            assert f"mlflow/{experiment}/{parent}/artifacts/{path}" in keys, path  # in the bucket, not on a disk
        (model_output,) = run.outputs.model_outputs
        model = client.get_logged_model(model_output.model_id)
        assert model.name == "best_model"
        assert f"mlflow/{experiment}/models/{model.model_id}/artifacts/MLmodel" in keys
        previous = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(server.url)
        try:
            loaded = mlflow.pytorch.load_model(f"runs:/{parent}/best_model")
        finally:
            mlflow.set_tracking_uri(previous)
        assert type(loaded).__name__ == "VisionTransformer" and not loaded.training
