"""A search on a SLURM allocation: ``scripts/cluster/slurm.sbatch`` submitted with ``sbatch`` to a real SLURM.

The cluster is one machine (tests/_slurm.py: munged, slurmctld and slurmd on 127.0.0.1, configured by the fixture, its
CPUs and one GPU as SLURM counts it), so the job's Ray cluster is its head alone; the search is the testbed ViT, a few
steps a trial, no plasticity. The job's output, its state and exit code (``scontrol show job``), the search's trial
table and its MLflow runs are read back. The time-limit signal is ``scancel --signal=TERM --batch``: what
``#SBATCH --signal=B:TERM@300`` sends before the time limit (to the batch shell only).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from _commands import search_args
from _slurm import LocalSlurm, unavailable
from _spaces import space_text
from mlflow.tracking import MlflowClient

from vitplast_tune.records import tracking

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster" / "slurm.sbatch"
JOB_TIMEOUT_S = 300  # one job, from submission to its end (a few tens of seconds); three fit the test timeout


def test_the_script_asks_slurm_for_the_signal_before_the_time_limit_and_passes_bash_checks():
    text = SCRIPT.read_text()
    directives = dict(
        line.removeprefix("#SBATCH --").split("=", 1) for line in text.splitlines() if line.startswith("#SBATCH --")
    )
    assert re.fullmatch(r"B:TERM@\d+", directives["signal"])  # to the batch shell, which passes it to the search
    assert directives["ntasks-per-node"] == "1" and int(directives["nodes"]) >= 2
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--space", "component_subsets"], "error: give the search a --name"),
        (["--name=x", "--address", "auto"], "error: --address is this job's own Ray cluster"),
        (["--name", "x"], "error: run this script with sbatch"),
    ],
)
def test_the_script_refuses_what_it_cannot_run_before_starting_anything(args, said, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith(said), proc.stdout + proc.stderr
    assert "Ray" not in proc.stdout  # nothing started


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


def write_space(path: Path, components: list[str], steps: int) -> Path:
    path.write_text(
        space_text(parameters={"components": {"choice": components}}, defaults={"max_steps": steps, "eval_every": 8})
    )
    return path


def submit(slurm: LocalSlurm, tmp_path: Path, args: list[str]) -> tuple[str, Path]:
    """The shipped script submitted as a user would (sbatch's flags for this one-machine cluster); (job id, its log)."""
    cpus = slurm.cpus
    flags = ["--nodes=1", f"--cpus-per-task={cpus}", "--time=00:15:00", f"--output={tmp_path}/job-%j.out"]
    job = slurm.submit(SCRIPT, flags, args, slurm.env(PATH=slurm.python_path()))
    return job, tmp_path / f"job-{job}.out"


def runs_by_trial(record: dict) -> tuple[MlflowClient, dict[str, list]]:
    client = MlflowClient(record["tracking_uri"])
    by_trial: dict[str, list] = {}
    for run in tracking.child_runs(client, record["parent_run_id"]):
        by_trial.setdefault(run.data.tags[tracking.TRIAL_TAG], []).append(run)
    return client, by_trial


def driver_line(log: Path) -> str:
    (line,) = [line for line in log.read_text().splitlines() if "python -m vitplast_tune search" in line]
    return line


def second_trial_checkpointed(directory: Path) -> dict | None:
    """The search's record, once one trial's run is FINISHED and the other's RUNNING with a checkpoint on disk."""
    if not (directory / "vitplast_search.json").is_file():
        return None
    record = json.loads((directory / "vitplast_search.json").read_text())
    _, by_trial = runs_by_trial(record)
    status = {trial: runs[0].info.status for trial, runs in by_trial.items()}
    running = [t for t, s in status.items() if s == "RUNNING"]
    if "FINISHED" in status.values() and running and list(directory.glob(f"trial_{running[0]}/checkpoint_*")):
        return record
    return None


def wait_for(condition, slurm: LocalSlurm, job: str, log: Path, timeout_s: float = JOB_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        state = slurm.job(job)["JobState"]
        text = log.read_text()[-6000:] if log.exists() else ""
        assert state in ("PENDING", "CONFIGURING", "RUNNING"), f"job {job} is {state} before a checkpoint:\n{text}"
        assert time.monotonic() < deadline, f"no second trial checkpointed within {timeout_s:g} s:\n{text}"
        time.sleep(0.5)
    return found


@pytest.mark.slow
def test_a_search_submitted_with_sbatch_stops_at_the_time_limit_signal_and_the_resubmitted_job_resumes_it(
    slurm, tmp_path
):
    """The shipped script submitted with sbatch: Ray over the allocation (the CPUs and the GPU SLURM gave the job),
    the search joins it. SIGTERM to the batch shell once the first of two trials ended and the second checkpointed:
    the job stops the search (runs KILLED, the resume command printed) and exits 143, leaving no process behind. The
    same sbatch command again resumes it: both trials end under their first ids, one MLflow run each, the interrupted
    one continued from its checkpoint, every trial on the allocation's node."""
    started = time.monotonic()
    space, storage = write_space(tmp_path / "two.yaml", ["mha", "fc1"], steps=192), tmp_path / "results"
    args = [*search_args(space, "limited", storage), "--max-concurrent", "1"]
    directory = storage / "limited"
    first, log = submit(slurm, tmp_path, args)
    record = wait_for(lambda: second_trial_checkpointed(directory), slurm, first, log)
    slurm.signal_batch(first)
    state = slurm.wait(first, JOB_TIMEOUT_S, log)
    out = log.read_text()
    assert (state["JobState"], state["ExitCode"]) == ("FAILED", "143:0"), out[-6000:]
    assert "SIGTERM from SLURM" in out and "continue the search with" in out, out[-6000:]
    assert "trial(s) unfinished" in out and "Traceback" not in out, out[-6000:]
    assert "submit the same sbatch command again" in out
    found = re.search(r"Ray cluster at (\S+): 1 of 1 node\(s\), \{CPU: (\d+), GPU: (\d+)\}", out)
    assert found and found.groups()[1:] == (str(slurm.cpus), "1"), out[-6000:]
    address = found.group(1)
    assert f"Joining the Ray cluster at {address} (--address)" in out
    assert "--resume" not in driver_line(log)  # a new search: no record to resume
    assert not (directory / "trials.csv").exists() and not (directory / "analysis").exists()  # no results written
    client, by_trial = runs_by_trial(record)
    assert client.get_run(record["parent_run_id"]).info.status == "KILLED"
    assert sorted(runs[0].info.status for runs in by_trial.values()) == ["FINISHED", "KILLED"], out[-6000:]
    interrupted = next(t for t, runs in by_trial.items() if runs[0].info.status == "KILLED")
    assert not (left := slurm.job_pids()), f"processes of the stopped job outlived it:\n{slurm.describe(left)}"
    stopped = time.monotonic() - started

    second, log = submit(slurm, tmp_path, args)  # the same command
    state = slurm.wait(second, JOB_TIMEOUT_S, log)
    out = log.read_text()
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), out[-6000:]
    assert driver_line(log).endswith(" --resume")  # the job found the search's record
    trials = pd.read_csv(directory / "trials.csv", dtype={"trial_id": str})
    assert len(trials) == 2 and trials["trial_id"].nunique() == 2 and (trials["step"] == 192).all()
    client, by_trial = runs_by_trial(record)
    assert sorted(by_trial) == sorted(trials["trial_id"]) and interrupted in by_trial  # no trial lost or repeated
    assert all(len(runs) == 1 and runs[0].info.status == "FINISHED" for runs in by_trial.values())
    assert client.get_run(record["parent_run_id"]).info.status == "FINISHED"
    (run,) = by_trial[interrupted]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")]
    assert set(steps) == set(range(8, 193, 8)) and len(steps) <= len(set(steps)) + 2  # continued, not restarted
    assert {runs[0].data.tags["ray.node_ip"] for runs in by_trial.values()} == {address.rsplit(":", 1)[0]}
    assert not (left := slurm.job_pids()), f"processes of the job outlived it:\n{slurm.describe(left)}"
    total = time.monotonic() - started
    print(f"SLURM jobs {first} (stopped) and {second} (resumed): {stopped:.0f} s and {total - stopped:.0f} s")


def test_the_script_says_which_slurm_command_it_lacks_before_starting_anything(tmp_path):
    """In a job whose node lacks SLURM's commands (none on PATH): one line naming the first, exit 2, nothing started."""
    (tmp_path / "bin").mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, "SLURM_JOB_ID": "7"}
    env["PATH"] = str(tmp_path / "bin")  # bash's builtins only
    proc = subprocess.run(
        ["/bin/bash", str(SCRIPT), "--name", "x"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == "error: scontrol is not on PATH here: run this script with sbatch on a SLURM node\n"
    assert "Ray" not in proc.stdout
