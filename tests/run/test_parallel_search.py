"""Searches whose trials train on two workers (a Ray Train run of two gloo ranks, the model in DDP), as a user runs
them (``scripts/search.py`` in a subprocess): on a real two-node cluster, where the two workers of a trial run on
two different nodes and follow the one-worker trial's loss curve; under ASHA and Optuna, with the driver SIGKILLed
and SIGTERMed and the search resumed; and with one of a trial's workers SIGKILLed while the other trial goes on."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from _commands import search_command
from _raycluster import LocalCluster, OwnedRay
from _spaces import space_text
from mlflow.tracking import MlflowClient

from vitplast_tune.records.tracking import FAILURE_TAG, TRIAL_TAG, WORKER_NODES_TAG, WORKERS_TAG, child_runs
from vitplast_tune.run import OptunaSearcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # a few searches each, on two busy cores
ROOT = Path(__file__).resolve().parents[2]
ATOL = 1e-6  # the loss curves at every evaluation (fp32): DDP sums the ranks' gradients in another order
EXACT = dict(augment="none", precision="fp32", batch_size=16, warmup_steps=2)  # what makes two curves comparable
KILL_WINDOW_S = 60  # a killed worker ends or restarts its trial within this (the old hand-made ranks stalled 600 s)


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


def held_by_tune(directory: Path) -> dict[str, int]:
    """The step of each trial's newest checkpoint in Tune's last saved experiment state: what a resume restores (the
    state lags a trial's newest checkpoint on a loaded machine, and a trial it holds none of restarts from scratch)."""
    saved = sorted(directory.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    try:
        trials = json.loads(saved[-1].read_text())["trial_data"] if saved else []
    except (FileNotFoundError, json.JSONDecodeError):  # replaced as it was read: look again
        return {}
    last = [json.loads(metadata)["last_result"] for _, metadata in trials]
    return {r["trial_id"]: r["step"] for r in last if r.get("checkpoint_dir_name")}


def running_checkpointed(directory: Path, at_least: int = 2, every: int = 8) -> dict[str, int]:
    """The trials whose MLflow run is RUNNING and whose checkpoint in Tune's saved state is at least their
    ``at_least``-th (one every ``every`` steps), with its step."""
    if not (directory / "vitplast_search.json").is_file():
        return {}
    _, _, by_trial = runs_by_trial(directory)
    running = {t for t, runs in by_trial.items() if runs[0].info.status == "RUNNING"}
    return {t: step for t, step in held_by_tune(directory).items() if t in running and step >= at_least * every}


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
    return done


def test_two_workers_on_two_nodes_follow_the_loss_curve_of_one_worker(two_nodes, searched):
    (client, _, by_trial_one), (_, _, by_trial_two) = searched["one"], searched["two"]
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


# ----------------------------------------------------------------------------- ASHA, Optuna and the driver killed


def test_asha_stops_two_worker_trials_optuna_is_told_pruned_and_a_sigkilled_driver_resumes(tmp_path, owned_ray):
    """TPE under ASHA over trials of two workers, two at once; the driver SIGKILLed once a trial is done and a running
    one has checkpointed twice; ``--resume``: every trial once, none lost, those ASHA stopped PRUNED in Optuna's study, and a trial
    cut by the kill continued from the checkpoint Tune's saved state held (no step up to it trained again)."""
    total, steps = 4, 24
    space = write_space(
        tmp_path / "space.yaml",
        steps=steps,
        eval_every=8,
        components=("fc1", "mha", "head", "ln1"),
        lr={"loguniform": [0.001, 0.3]},
        algorithm="optuna",
        num_samples=total,
        scheduler={"name": "asha", "grace_period": 8, "reduction_factor": 2},
    )
    directory, log = tmp_path / "results" / "crash", tmp_path / "search.log"
    cmd = search_command(space, "crash", directory.parent, "--workers-per-trial", "2", "--seed", "3")
    cmd += ["--max-concurrent", "2"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=owned_ray.env, start_new_session=True)
        wait_until(lambda: f"1/{total} trials done" in log.read_text(), proc, log, what="a trial done")
        wait_until(lambda: running_checkpointed(directory), proc, log, what="a running trial's checkpoints")
        held = held_by_tune(directory)  # a resume restores at least these (a later save only holds more)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    owned_ray.kill_all()  # the orphaned raylet, GCS, Train controller and workers this driver had started

    # The resources of a trial are not in the search's record: the user gives them again, as the printed command does
    resume = search_command(space, "crash", directory.parent, "--workers-per-trial", "2", "--resume", "--quiet")
    resumed = subprocess.run(resume, env=owned_ray.env, capture_output=True, text=True, timeout=1800)
    assert resumed.returncode == 0, explain(resumed)
    trials = pd.read_csv(directory / "trials.csv", dtype={"trial_id": str})
    assert len(trials) == total and trials["trial_id"].nunique() == total and trials["error"].isna().all()
    stopped = trials["step"] < steps
    assert stopped.any() and (trials["step"] >= 8).all()  # ASHA stopped some at a rung, none before its first
    client, record, by_trial = runs_by_trial(directory)
    assert sorted(by_trial) == sorted(trials["trial_id"])  # one MLflow run per trial, none duplicated
    for trial in trials.itertuples():
        (run,) = by_trial[trial.trial_id]
        assert run.info.status == "FINISHED" and run.data.tags[WORKERS_TAG] == "2"
        steps_now = [s for s, _ in history(client, run, "val_acc")]
        assert set(steps_now) == set(range(8, int(trial.step) + 1, 8))
        _assert_resumed_after(steps_now, held.get(trial.trial_id, 0))
    searcher = OptunaSearcher()
    searcher.restore_from_dir(str(directory))
    states = sorted(t.state.name for t in searcher._ot_study.trials)
    assert states == sorted("PRUNED" if s else "COMPLETE" for s in stopped)  # ASHA's stopped trials are not final


def test_a_sigtermed_driver_resumes_a_two_worker_trial_from_its_checkpoint(tmp_path, owned_ray):
    """SIGTERM while the second of two trials of two workers trains (after its checkpoints): exit 143, its run
    KILLED; ``--resume`` continues it in its own run from its last checkpoint, to the end."""
    space = write_space(tmp_path / "space.yaml", steps=64, eval_every=8, components=("mha", "fc1"))
    directory, log = tmp_path / "results" / "term", tmp_path / "search.log"
    cmd = search_command(space, "term", directory.parent, "--workers-per-trial", "2", "--max-concurrent", "1")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=owned_ray.env, start_new_session=True)
        wait_until(lambda: "1/2 trials done" in log.read_text(), proc, log, what="the first trial done")
        wait_until(lambda: running_checkpointed(directory), proc, log, what="the second trial's checkpoints")
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=300)
    assert proc.returncode == 143, log.read_text()
    client, record, by_trial = runs_by_trial(directory)
    assert sorted(runs[0].info.status for runs in by_trial.values()) == ["FINISHED", "KILLED"]
    (interrupted,) = [t for t, runs in by_trial.items() if runs[0].info.status == "KILLED"]
    held = held_by_tune(directory)  # a stopped search saves its state: the trial's newest checkpoint
    assert 16 <= held[interrupted] < 64

    (line,) = [line for line in log.read_text().splitlines() if "continue the search with vitplast search" in line]
    command = shlex.split(line.split("continue the search with ", 1)[1])
    assert "--workers-per-trial" in command and "--resume" in command  # the printed command keeps the workers
    resume = [sys.executable, "-m", "vitplast_tune", *command[1:]]
    resumed = subprocess.run(resume, env=owned_ray.env, capture_output=True, text=True, timeout=1800)
    assert resumed.returncode == 0, explain(resumed)
    trials = pd.read_csv(directory / "trials.csv", dtype={"trial_id": str})
    assert len(trials) == 2 and (trials["step"] == 64).all() and trials["error"].isna().all()
    client, record, by_trial = runs_by_trial(directory)
    assert sorted(by_trial) == sorted(trials["trial_id"]) and all(len(r) == 1 for r in by_trial.values())
    (run,) = by_trial[interrupted]
    assert run.info.status == "FINISHED" and run.data.tags[WORKERS_TAG] == "2"
    steps_now = [s for s, _ in history(client, run, "val_acc")]
    assert set(steps_now) == set(range(8, 65, 8))
    _assert_resumed_after(steps_now, held[interrupted])


def _assert_resumed_after(steps_now: list[int], held: int) -> None:
    """A trial resumed from the checkpoint Tune's saved state held (at step ``held``) trained none of the steps up to
    it again: each of them is logged once."""
    again = [s for s in steps_now if s <= held and steps_now.count(s) > 1]
    assert not again, f"steps up to the held checkpoint ({held}) trained again: {steps_now}"


# ----------------------------------------------------------------------------- a worker killed


@pytest.mark.parametrize("max_failures", [0, 1])
def test_a_killed_worker_ends_or_restarts_its_trial_and_the_other_trial_goes_on(tmp_path, owned_ray, max_failures):
    """Two trials of two workers at once; one worker of one trial SIGKILLed after its checkpoints. With
    ``--max-failures 0`` Train's run fails: the trial ends FAILED within a minute, the cause on its MLflow run and in
    the search's summary. With 1, Train restarts the workers from its last checkpoint and the trial finishes. The
    other trial trains to its end either way, and the search records every trial."""
    steps = 96
    space = write_space(tmp_path / "space.yaml", steps=steps, eval_every=8, components=("mha", "fc1"))
    directory, log = tmp_path / "results" / "lost", tmp_path / "search.log"
    extra = ("--workers-per-trial", "2", "--max-failures", str(max_failures))
    cmd = search_command(space, "lost", directory.parent, *extra)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=owned_ray.env, start_new_session=True)
        wait_until(lambda: len(checkpointed_trials(directory, 2)) == 2, proc, log, what="both trials' checkpoints")
        workers = wait_until(lambda: owned_ray.pids("RayTrainWorker"), proc, log, what="Train's workers")
        assert len(workers) == 4, workers  # two trials, two workers each
        victim = workers[0]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        proc.wait(timeout=900)
    out = log.read_text()
    trials = pd.read_csv(directory / "trials.csv", dtype={"trial_id": str})
    client, record, by_trial = runs_by_trial(directory)
    assert len(trials) == 2 and sorted(by_trial) == sorted(trials["trial_id"])
    failed = trials[trials["error"].notna()]
    if max_failures == 0:
        assert len(failed) == 1, out
        (run,) = by_trial[failed["trial_id"].iloc[0]]
        assert run.info.status == "FAILED"
        cause = run.data.tags[FAILURE_TAG]  # the killed rank's error first: its health check failed
        assert "WorkersFailed: the Train run of 2 workers failed (max_failures 0 spent): rank " in cause, cause
        assert "WorkerHealthCheckFailedError" in cause, cause
        assert run.info.end_time / 1000 - killed_at < KILL_WINDOW_S  # ended within the minute, not 600 s
        assert failed["error"].iloc[0] == cause  # the trial table's cause is the run's
        trial_id, components = failed["trial_id"].iloc[0], failed["components"].iloc[0]
        summary = out[out.index("trial(s) failed or diverged") :]
        assert f"  trial {trial_id} ({components}): {cause}" in summary, out  # the search's summary names it
        others = trials[trials["error"].isna()]
    else:
        assert failed.empty, out
        others = trials
    assert len(others) >= 1 and (others["step"] == steps).all()  # the other trial (and a restarted one) went on
    for trial in others.itertuples():
        (run,) = by_trial[trial.trial_id]
        assert run.info.status == "FINISHED"
        steps_now = [s for s, _ in history(client, run, "val_acc")]
        assert set(steps_now) == set(range(8, steps + 1, 8))
        assert len(steps_now) <= len(set(steps_now)) + 3  # a restarted trial went on from a checkpoint
    assert proc.returncode == 0, out
