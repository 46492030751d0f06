"""Searches whose trials train on two workers (a Ray Train run of two gloo ranks, the model in DDP), as a user runs
them (``scripts/search.py`` in a subprocess): on a real two-node cluster, where the two workers of a trial run on
two different nodes and follow the one-worker trial's loss curve, checkpoints and best model; and with one of a
trial's workers SIGKILLed while the other trial goes on, Train restarting the trial from its checkpoint.

A driver killed or sent SIGTERM and resumed is tested end to end once, on one-worker trials
(tests/run/test_reliability.py): the resume is Tune's whatever a trial's workers. That a two-worker trial resumed
from its checkpoint ends as the uninterrupted one is tested on Train's run itself (tests/run/test_parallel.py), the
printed resume command's ``--workers-per-trial`` in tests/run/test_interrupts.py, and a failed Train run's one-line
cause in tests/run/test_parallel.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from _commands import search_command
from _raycluster import LocalCluster, OwnedRay
from _spaces import space_text
from mlflow.tracking import MlflowClient

from vitplast_tune.records.tracking import TRIAL_TAG, WORKER_NODES_TAG, WORKERS_TAG, child_runs
from vitplast_tune.vit import best_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # a few searches each, on two busy cores
ROOT = Path(__file__).resolve().parents[2]
ATOL = 1e-6  # the loss curves at every evaluation (fp32): DDP sums the ranks' gradients in another order
EXACT = dict(augment="none", precision="fp32", batch_size=16, warmup_steps=2)  # what makes two curves comparable


def write_space(path: Path, *, steps: int, eval_every: int, components=("fc1",), **top) -> Path:
    parameters = {"components": {"choice": list(components)}, "lr": top.pop("lr", {"choice": [0.05]})}
    defaults = {**EXACT, "max_steps": steps, "eval_every": eval_every, "grad_clip": 0.0}
    path.write_text(space_text(parameters=parameters, defaults=defaults, **top))
    return path


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"


def runs_by_trial(directory: Path) -> tuple[MlflowClient, dict, dict]:
    """The MLflow client, the search's record and its child runs by trial id."""
    record = json.loads((directory / "vitplast_search.json").read_text())
    client = MlflowClient(record["tracking_uri"])
    by_trial: dict[str, list] = {}
    for run in child_runs(client, record["parent_run_id"]):
        by_trial.setdefault(run.data.tags[TRIAL_TAG], []).append(run)
    return client, record, by_trial


def history(client: MlflowClient, run, metric: str) -> list[tuple[int, float]]:
    """(step, value) of every logged value of ``metric``, by step then time."""
    found = client.get_metric_history(run.info.run_id, metric)
    return [(m.step, m.value) for m in sorted(found, key=lambda m: (m.step, m.timestamp))]


def wait_until(condition, proc: subprocess.Popen, log: Path, timeout: float = 1800, what: str = "the condition"):
    """Poll ``condition()`` (truthy: done) every half second while ``proc`` runs; return its value."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if found := condition():
            return found
        if proc.poll() is not None:
            raise AssertionError(f"the search exited ({proc.returncode}) before {what}:\n{log.read_text()[-6000:]}")
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout} s:\n{log.read_text()[-6000:]}")


def checkpointed_trials(directory: Path, at_least: int = 1) -> list[str]:
    """The trials with ``at_least`` checkpoints in the search's folder (Tune's copies of their reports)."""
    trials = [t for t in directory.glob("trial_*") if len(list(t.glob("checkpoint_*"))) >= at_least]
    return [t.name.removeprefix("trial_") for t in trials]


@pytest.fixture
def owned_ray():
    owned = OwnedRay()
    yield owned
    owned.kill_all()


# ----------------------------------------------------------------------------- two nodes, two workers


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("two-nodes"), head_cpus=1)
    try:
        cluster.add_worker(cpus=1)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def searched(two_nodes, tmp_path_factory):
    """The same one-trial search on one worker and on two spread over the two nodes (half a CPU each)."""
    root = tmp_path_factory.mktemp("two-node-search")
    space = write_space(root / "space.yaml", steps=8, eval_every=2)
    tracking = f"sqlite:///{root / 'mlflow.db'}"
    done = {}
    for name, extra in [("one", ()), ("two", ("--workers-per-trial", "2", "--placement", "spread"))]:
        cmd = search_command(space, name, root / "results", "--address", two_nodes.address, "--tracking-uri", tracking)
        proc = subprocess.run([*cmd, *extra], env=two_nodes.env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, explain(proc)
        done[name] = runs_by_trial(root / "results" / name)
    return done, root / "results"


def test_two_workers_on_two_nodes_follow_the_loss_curve_of_one_worker(two_nodes, searched):
    done, results = searched
    (client, _, by_trial_one), (_, _, by_trial_two) = done["one"], done["two"]
    ((one,),), ((two,),) = by_trial_one.values(), by_trial_two.values()
    assert one.info.status == two.info.status == "FINISHED"
    nodes = {n["NodeID"] for n in two_nodes.alive_nodes()}
    worker_nodes = two.data.tags[WORKER_NODES_TAG].split(",")
    assert two.data.tags[WORKERS_TAG] == "2" and len(worker_nodes) == 2
    assert len(set(worker_nodes)) == 2 and set(worker_nodes) == nodes  # one worker on each node
    assert two.data.tags["ray.node_id"] == worker_nodes[0]  # the run's node: rank 0's
    curve_one, curve_two = history(client, one, "train_loss"), history(client, two, "train_loss")
    assert [s for s, _ in curve_one] == [s for s, _ in curve_two] == [2, 4, 6, 8]  # one value a step: rank 0's
    assert [v for _, v in curve_two] == pytest.approx([v for _, v in curve_one], rel=0, abs=ATOL)
    val_one, val_two = history(client, one, "val_loss"), history(client, two, "val_loss")
    assert [s for s, _ in val_two] == [2, 4, 6, 8]
    assert [v for _, v in val_two] == pytest.approx([v for _, v in val_one], rel=0, abs=ATOL)
    assert set(two.data.metrics) == set(one.data.metrics)  # one set of metrics, as a one-worker trial's
    assert two.data.params == one.data.params
    kept = [sorted(p.parent.name for p in (results / name).rglob("state.pt")) for name in ("one", "two")]
    assert kept[0] == kept[1] and len(kept[0]) == 2  # the two latest checkpoints, in the search's storage
    models = [best_model.load_best_model(name, results) for name in ("one", "two")]
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(models[1](x), models[0](x), rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------- a worker killed


def test_a_killed_worker_restarts_its_trial_from_its_checkpoint_and_the_other_trial_goes_on(tmp_path, owned_ray):
    """Two trials of two workers at once; one worker of one trial SIGKILLed after its checkpoints. With
    ``--max-failures 1`` Train restarts the workers from its last checkpoint and the trial finishes; the other trial
    trains to its end, and the search records every trial. (With 0, the trial ends FAILED with the killed rank's
    error first: tests/run/test_parallel.py holds that line on Train's real failure.)"""
    steps = 96
    space = write_space(tmp_path / "space.yaml", steps=steps, eval_every=8, components=("mha", "fc1"))
    directory, log = tmp_path / "results" / "lost", tmp_path / "search.log"
    cmd = search_command(space, "lost", directory.parent, "--workers-per-trial", "2", "--max-failures", "1")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=owned_ray.env, start_new_session=True)
        wait_until(lambda: len(checkpointed_trials(directory, 2)) == 2, proc, log, what="both trials' checkpoints")
        workers = wait_until(lambda: owned_ray.pids("RayTrainWorker"), proc, log, what="Train's workers")
        assert len(workers) == 4, workers  # two trials, two workers each
        os.kill(workers[0], signal.SIGKILL)
        proc.wait(timeout=900)
    out = log.read_text()
    assert proc.returncode == 0, out
    trials = pd.read_csv(directory / "trials.csv", dtype={"trial_id": str})
    client, record, by_trial = runs_by_trial(directory)
    assert len(trials) == 2 and sorted(by_trial) == sorted(trials["trial_id"])
    assert trials["error"].isna().all() and (trials["step"] == steps).all(), out  # both went on to the end
    for trial in trials.itertuples():
        (run,) = by_trial[trial.trial_id]
        assert run.info.status == "FINISHED"
        steps_now = [s for s, _ in history(client, run, "val_acc")]
        assert set(steps_now) == set(range(8, steps + 1, 8))
        assert len(steps_now) <= len(set(steps_now)) + 3  # a restarted trial went on from a checkpoint
