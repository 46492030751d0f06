"""A killed driver resumes, a diverging trial fails cleanly, a signal at any phase is resumed.

A worker lost mid-trial is retried from its checkpoint on another node, where it can read nothing but the shared
store: tests/run/test_share_nothing.py (the same Tune retry, the stricter case). SIGTERM mid-trial (runs KILLED, exit
143, the resume command printed, each trial continued in its own run) is the SLURM time-limit test's
(tests/run/test_slurm.py: SLURM sends the search SIGTERM); SIGTERM reaches Tune's Ctrl-C handler
(tests/run/test_interrupts.py), so that is Ctrl-C's path too. A budget below the scheduler's grace period is clamped in
the plan, with a note (tests/plan/test_prepare.py)."""

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
import yaml
from _raycluster import OwnedRay
from _spaces import space_text
from mlflow.tracking import MlflowClient

from vitplast_tune.plan import SearchOptions
from vitplast_tune.records import summary
from vitplast_tune.records.tracking import SEARCH_ID_TAG, TRIAL_TAG, child_runs
from vitplast_tune.run import OptunaSearcher
from vitplast_tune.run.driver import run as run_search

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def write_space(
    path,
    algorithm="optuna",
    num_samples=5,
    components="{subsets: any}",
    lr="{loguniform: [0.01, 0.3]}",
    steps=48,
    scheduler="fifo",
):
    parameters = {"components": yaml.safe_load(components), "lr": yaml.safe_load(lr)}
    path.write_text(
        space_text(
            algorithm=algorithm,
            num_samples=num_samples,
            scheduler=yaml.safe_load(scheduler),  # "fifo", or an ASHA mapping written in YAML
            parameters=parameters,
            defaults={"max_steps": steps, "grad_clip": 0.0},
        )
    )
    return path


@pytest.fixture
def owned_ray():
    owned = OwnedRay()
    yield owned
    owned.kill_all()


def start_search(owned, *args):
    cmd = [sys.executable, str(ROOT / "scripts" / "search.py"), "--no-plasticity", "--cpus-per-trial", "1", *args]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=owned.env, start_new_session=True
    )


def wait_for_line(proc, text, timeout=240):
    deadline, seen = time.time() + timeout, []
    for line in proc.stdout:
        seen.append(line)
        if text in line:
            return seen
        if time.time() > deadline:
            break
    raise AssertionError(f"never saw {text!r}; output:\n{''.join(seen[-40:])}")


def child_runs_by_trial(parent_run_id, tracking_uri):
    client = MlflowClient(tracking_uri)
    runs = child_runs(client, parent_run_id)
    by_trial = {}
    for run in runs:
        by_trial.setdefault(run.data.tags[TRIAL_TAG], []).append(run)
    return client, by_trial


# Where the driver is SIGKILLed: Optuna's TPE under ASHA, so that both the searcher and the scheduler are restored.
# (A grid's resume, the basic variant generator restored from the experiment state, is the SIGTERM test's.)
KILLED_SPACE = dict(num_samples=6, scheduler="{name: asha, grace_period: 16, reduction_factor: 2}")


def test_sigkilled_driver_resumes_without_losing_or_repeating_trials(tmp_path, owned_ray):
    total = KILLED_SPACE["num_samples"]
    space = write_space(tmp_path / "space.yaml", **KILLED_SPACE)
    args = ["--space", str(space), "--name", "crash", "--storage", str(tmp_path / "results"), "--seed", "3"]
    proc = start_search(owned_ray, *args)
    wait_for_line(proc, f"2/{total} trials done")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    owned_ray.kill_all()  # the orphaned raylet, GCS and workers this driver had started

    resumed = start_search(
        owned_ray,
        "--space",
        str(space),
        "--name",
        "crash",
        "--storage",
        str(tmp_path / "results"),
        "--resume",
        "--quiet",
    )  # the recorded settings; this run's callbacks
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    assert "trials done" not in out  # --quiet reached the restored Tuner (Ray restores the pickled callbacks)
    directory = tmp_path / "results" / "crash"
    trials = pd.read_csv(directory / "trials.csv")
    assert len(trials) == total and trials["trial_id"].nunique() == total and trials["error"].isna().all()
    stopped = trials["step"] < 48
    assert stopped.any() and (trials["step"] >= 16).all()  # ASHA stopped some at a rung, none before its first

    record = json.loads((directory / "vitplast_search.json").read_text())
    client, by_trial = child_runs_by_trial(record["parent_run_id"], record["tracking_uri"])
    parent = client.get_run(record["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags[SEARCH_ID_TAG] == record["search_id"]
    assert sorted(by_trial) == sorted(trials["trial_id"])  # one MLflow run per trial, none duplicated
    for trial in trials.itertuples():
        (run,) = by_trial[trial.trial_id]
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")]
        assert set(steps) == set(range(8, int(trial.step) + 1, 8))
        # a resumed trial repeats at most the segments after the last checkpoint Tune's experiment state recorded
        assert len(steps) <= len(set(steps)) + 2
    searcher = OptunaSearcher()
    searcher.restore_from_dir(str(directory))
    study_trials = searcher._ot_study.trials
    assert len(study_trials) == total
    assert len({tuple(sorted(t.params.items())) for t in study_trials}) == total  # no repeated suggestion
    states = sorted(t.state.name for t in study_trials)
    assert states == sorted("PRUNED" if s else "COMPLETE" for s in stopped)  # ASHA's stopped trials are not final


def test_diverging_trial_is_failed_in_mlflow_and_optuna(ray_local, tmp_path):
    space = write_space(
        tmp_path / "space.yaml",
        num_samples=4,
        components="{choice: [mha, fc1]}",
        lr="{choice: [0.05, 1.0e+6]}",
        steps=24,
    )
    options = SearchOptions(
        space=str(space), name="nan", storage=str(tmp_path / "results"), seed=0, plasticity=False, verbose=0
    )
    result = run_search(options)
    trials = result.trials
    assert set(trials["lr"]) == {0.05, 1e6}
    diverged = trials[trials["lr"] == 1e6]
    assert diverged["diverged"].all() and (~trials[trials["lr"] == 0.05]["diverged"]).all()
    assert (trials[trials["lr"] == 0.05]["step"] == 24).all()

    client, by_trial = child_runs_by_trial(result.parent_run_id, result.place.tracking_uri)
    for trial in trials.itertuples():
        (run,) = by_trial[trial.trial_id]
        if trial.diverged:
            assert run.info.status == "FAILED"
            assert "training loss became nan" in run.data.tags["failure_reason"]
        else:
            assert run.info.status == "FINISHED"

    searcher = OptunaSearcher()
    searcher.restore_from_dir(str(result.place.local_dir))
    states = {t.params["lr"]: t.state.name for t in searcher._ot_study.trials}
    assert states == {0.05: "COMPLETE", 1e6: "FAIL"}
    assert "failed or diverged" in summary(result)


def wait_until(condition, proc, log, timeout=600, what="the condition"):
    """Poll ``condition()`` (truthy: done) every half second while ``proc`` runs; return its value."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = condition()
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"the search exited ({proc.returncode}) before {what}:\n{log.read_text()}")
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout} s:\n{log.read_text()}")


def second_trial_checkpointed(directory):
    """Once one trial's MLflow run is FINISHED and another's is RUNNING with a checkpoint on disk: the record."""
    record_path = directory / "vitplast_search.json"
    if not record_path.is_file():
        return None
    record = json.loads(record_path.read_text())
    client, by_trial = child_runs_by_trial(record["parent_run_id"], record["tracking_uri"])
    status = {trial: runs[0].info.status for trial, runs in by_trial.items()}
    running = [t for t, s in status.items() if s == "RUNNING"]
    if "FINISHED" in status.values() and running and list(directory.glob(f"trial_{running[0]}/checkpoint_*")):
        return record
    return None


def study_while_running(study_url, directory):
    """The live study's trials (state, value, steps) once one trial has ended in it and the search has not yet
    reached its end phase (no trial table yet): what optuna-dashboard would show then."""
    import optuna

    if (directory / "trials.csv").exists() or not (directory / "optuna.db").exists():
        return None
    try:
        trials = optuna.load_study(study_name="end", storage=study_url).trials
    except KeyError:  # the study not made yet
        return None
    ended = [t for t in trials if t.state.is_finished()]
    return [(t.state.name, t.value, sorted(t.intermediate_values)) for t in ended] or None


def test_the_study_is_live_and_a_signal_in_the_end_phase_is_finished_by_resume(tmp_path, owned_ray):
    """Three trials one at a time (the second pruned by ASHA at its first rung; the third, as bad, pruned or not by
    where it falls among the first two): the Optuna study holds the first while the others run (two trials after it,
    so that a loaded machine's polls see that), all of them (COMPLETE, PRUNED, ...) before the end phase; Ctrl-C as
    the end phase writes the results (SIGTERM waits for them there: test_interrupts) stops it with the command that
    finishes it (exit 130, the parent run KILLED, the trial runs FINISHED); that command runs no trial again, writes
    what was missing once (the trial table on the parent run, each trial's final metrics, the best model) and ends
    the parent run FINISHED."""
    import mlflow
    import optuna

    space = write_space(
        tmp_path / "end.yaml",
        algorithm="grid",
        num_samples=1,
        components="{choice: [fc1]}",
        lr="{choice: [0.05, 0.00001, 0.000001]}",
        steps=48,
        scheduler="{name: asha, grace_period: 16, reduction_factor: 2}",
    )
    directory, log = tmp_path / "results" / "end", tmp_path / "search.log"
    args = ["--space", str(space), "--name", "end", "--storage", str(directory.parent), "--max-concurrent", "1"]
    held = tmp_path / "held"  # the end phase waits there for the signal (tests/_hold_end.py): it cannot end first
    cmd = [sys.executable, str(ROOT / "tests" / "_hold_end.py"), str(held), "--no-plasticity", *args]
    url = f"sqlite:///{directory / 'optuna.db'}"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=owned_ray.env, start_new_session=True)
        live = wait_until(lambda: study_while_running(url, directory), proc, log, what="a trial in the live study")
        wait_until(lambda: (held / "end.held").exists(), proc, log, what="the end phase")
        assert (directory / "trials.csv").exists()  # the phase held: its trial table written, the rest not yet
        ended = [
            (t.state.name, sorted(t.intermediate_values))
            for t in optuna.load_study(study_name="end", storage=url).trials
        ]
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=300)
    out = log.read_text()
    assert live[0] == ("COMPLETE", pytest.approx(live[0][1]), [8, 16, 24, 32, 40, 48]), live  # the first, as it ended
    full, rung = ("COMPLETE", [8, 16, 24, 32, 40, 48]), ("PRUNED", [8, 16])
    assert ended[:2] == [full, rung] and ended[2] in (full, rung), ended  # all three, before the end phase
    assert f"Optuna study (fills in as trials end): optuna-dashboard {url}" in out
    assert proc.returncode == 130, out
    assert "Traceback" not in out, out
    (line,) = [line for line in out.splitlines() if "finish it with vitplast search" in line]
    assert "every trial had ended" in line and "no trial runs again" in line
    record = json.loads((directory / "vitplast_search.json").read_text())
    client, by_trial = child_runs_by_trial(record["parent_run_id"], record["tracking_uri"])
    assert client.get_run(record["parent_run_id"]).info.status == "KILLED"
    assert [runs[0].info.status for runs in by_trial.values()] == ["FINISHED"] * 3
    reports = {t: len(client.get_metric_history(runs[0].info.run_id, "val_acc")) for t, runs in by_trial.items()}

    command = shlex.split(line.split("finish it with ", 1)[1])
    resumed = subprocess.run(
        [sys.executable, "-m", "vitplast_tune", *command[1:]], capture_output=True, text=True, env=owned_ray.env
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    parent = client.get_run(record["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.metrics["num_trials"] == 3
    client, again = child_runs_by_trial(record["parent_run_id"], record["tracking_uri"])
    assert sorted(again) == sorted(by_trial) and all(len(runs) == 1 for runs in again.values())  # no trial again
    for trial, (run,) in again.items():
        assert run.info.status == "FINISHED"
        assert len(client.get_metric_history(run.info.run_id, "val_acc")) == reports[trial]
        assert len(client.get_metric_history(run.info.run_id, "best_val_loss")) == 1  # the finals, once
    table = Path(client.download_artifacts(record["parent_run_id"], "trials.json")).read_text()
    assert len(json.loads(table)["data"]) == 3  # the parent's trial table once, not appended to
    models = [o.model_id for o in parent.outputs.model_outputs]
    assert [client.get_logged_model(m).name for m in models] == ["best_model"]
    with mlflow_tracking(record["tracking_uri"]):
        model = mlflow.pytorch.load_model(f"runs:/{record['parent_run_id']}/best_model")
    assert type(model).__name__ == "VisionTransformer"
    assert len(optuna.load_study(study_name="end", storage=url).trials) == 3


def mlflow_tracking(uri):
    """``uri`` as MLflow's tracking URI in a block, put back after."""
    import contextlib

    import mlflow

    @contextlib.contextmanager
    def block():
        previous = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(uri)
        try:
            yield
        finally:
            mlflow.set_tracking_uri(previous)

    return block()
