"""Faults at the edges of a running search, each started for real: a second driver of a running search, a resumed
search whose Tune state, checkpoint or study is cut short, the best model of an interrupted search, a searcher's state
moved aside, and a disk that fills while trials run (a small tmpfs)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
from _commands import refused
from _disk import fill, small_disk
from _spaces import space_text
from mlflow.tracking import MlflowClient
from ray.tune import Callback

from vitplast_tune import load_best_model
from vitplast_tune.errors import SearchInterrupted, UserError
from vitplast_tune.plan import SearchOptions
from vitplast_tune.records.tracking import ROLE_TAG, SEARCH_TAG, child_runs
from vitplast_tune.run import driver, guard, interrupts
from vitplast_tune.run.driver import run as run_search

pytestmark = pytest.mark.slow
SPACE = space_text(
    algorithm="optuna",
    num_samples=4,  # one more than Tune holds when it stops in the second: a new TPE has one to sample
    parameters={"components": {"choice": ["mha", "fc1"]}, "lr": {"loguniform": [0.01, 0.3]}},
    defaults={"max_steps": 16, "eval_every": 8},
)


@dataclass
class Second:
    """What a second driver of the running search did: its exit code, stderr and the Ray sessions it started."""

    code: int = -1
    err: str = ""
    sessions: list[str] = field(default_factory=list)


class SecondDriverThenStop(Callback):
    """When the first trial ends, a second driver of the same search (a real ``vitplast search`` process); when the
    next trial has reported (and checkpointed) once, Ctrl-C as Tune takes it."""

    def __init__(self, argv: list[str]):
        self.argv, self.second, self.done, self.stopped = argv, Second(), None, False

    def on_trial_complete(self, iteration, trials, trial, **info):
        if self.done is None:
            self.done = trial.trial_id
            ray_tmp = tempfile.mkdtemp(prefix="vt2", dir="/tmp")  # its own, to see whether it started Ray
            proc = subprocess.run(
                [sys.executable, "-m", "vitplast_tune", "search", *self.argv],
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "RAY_TMPDIR": ray_tmp},
            )
            self.second = Second(proc.returncode, proc.stderr, [p.name for p in Path(ray_tmp).glob("ray/session_*")])
            shutil.rmtree(ray_tmp, ignore_errors=True)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        later = self.done is not None and trial.trial_id != self.done
        if later and result.get("checkpoint_dir_name") and not self.stopped:
            self.stopped = True
            interrupts.stop_tune()


@dataclass
class Stopped:
    root: Path
    directory: Path
    argv: list[str]
    error: SearchInterrupted
    second: Second

    @property
    def record(self) -> dict:
        return json.loads((self.directory / "vitplast_search.json").read_text())

    def runs(self) -> tuple[str, dict[str, str]]:
        """The parent run's status and each trial run's."""
        client = MlflowClient(self.record["tracking_uri"])
        parent = self.record["parent_run_id"]
        children = {r.info.run_name: r.info.status for r in child_runs(client, parent)}
        return client.get_run(parent).info.status, children


@pytest.fixture(scope="module")
def stopped(ray_local, tmp_path_factory):
    """A real search interrupted in its second trial, after a second driver of it was tried during its first."""
    root = tmp_path_factory.mktemp("faults")
    (root / "space.yaml").write_text(SPACE)
    argv = ["--space", str(root / "space.yaml"), "--name", "faults", "--storage", str(root / "results")]
    callback = SecondDriverThenStop([*argv, "--no-plasticity"])
    options = SearchOptions(space=argv[1], name="faults", storage=argv[5], plasticity=False, verbose=0)
    with pytest.raises(SearchInterrupted) as interrupted:
        run_search(options, callbacks=[callback])
    return Stopped(root, root / "results" / "faults", [*argv, "--no-plasticity"], interrupted.value, callback.second)


def test_a_second_driver_of_a_running_search_is_refused_naming_the_running_one(stopped):
    second = stopped.second
    lines = [line for line in second.err.splitlines() if line.strip()]
    assert second.code == 2 and len(lines) == 1, second.err  # both were accepted, and shared one folder, before
    assert lines[0].startswith('error: search "faults" is running: its driver, pid ')
    assert f"pid {os.getpid()} on {socket.gethostname()} since " in lines[0] and f"(kill {os.getpid()})" in lines[0]
    assert second.sessions == []  # refused before Ray started
    client = MlflowClient(stopped.record["tracking_uri"])
    parents = client.search_runs(
        [client.get_experiment_by_name("vitplast_tune").experiment_id],
        filter_string=f"tags.`{SEARCH_TAG}` = 'faults' and tags.`{ROLE_TAG}` = 'search'",
    )
    assert len(parents) == 1  # one parent run of that name (two before)
    assert stopped.error.exit_code == 130 and "--resume" in str(stopped.error)
    assert not (stopped.directory / ".driver.json").exists()  # the first driver gave its lock back


@pytest.fixture
def no_search(monkeypatch):
    """A search that gets past its checks fails the test (and leaves the stopped search as it is)."""

    def work(*args, **kwargs):
        raise AssertionError("the search started: its state was not refused")

    monkeypatch.setattr(driver, "execute", work)


def resume(stopped, capsys, *extra: str) -> str:
    """``vitplast search ... --resume`` in this process, refused: its one line (no Ray session started)."""
    return refused("search", [*stopped.argv, "--resume", *extra], stopped.root, capsys)


def cut_short(path: Path) -> bytes:
    """Cut ``path`` to half its length; return what it held."""
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    return whole


def unfinished_checkpoint(directory: Path) -> Path:
    """The checkpoint folder of the trial that was running when the search stopped (from Tune's state)."""
    state = json.loads(max(directory.glob("experiment_state-*.json")).read_text())
    for trial, metadata in state["trial_data"]:
        trial, metadata = json.loads(trial), json.loads(metadata)
        checkpoint = (metadata.get("last_result") or {}).get("checkpoint_dir_name")
        if trial["status"] != "TERMINATED" and checkpoint:
            return directory / f"trial_{trial['trial_id']}" / checkpoint
    raise AssertionError("no unfinished trial with a checkpoint")


@pytest.mark.parametrize(
    "which, said",
    [
        ("searcher-state-*.pkl", "the state of the searcher in Tune's folder, {path}, is cut short: move it aside and"),
        ("search_gen_state-*.json", "the state of the search generator in Tune's folder, {path}, is cut short"),
        ("callback-states-*.pkl", "is cut short: move it aside and --resume again (the callbacks start afresh"),
        ("experiment_state-*.json", "Tune's experiment state {path} is cut short or corrupt"),
        ("tuner.pkl", "Tune's Tuner {path} is cut short: the search cannot be resumed from it"),
        ("state.pt", "the checkpoint trial {trial} resumes from, {path}, is cut short or corrupt"),
        ("best.safetensors", "the checkpoint trial {trial} resumes from, {path}, is cut short ("),
    ],
)
def test_a_state_file_cut_short_is_one_line_before_ray_and_the_runs_stay_closed(
    stopped, capsys, no_search, which, said
):
    folder = unfinished_checkpoint(stopped.directory) if which.endswith(("pt", "safetensors")) else stopped.directory
    path = max(folder.glob(which))
    whole = cut_short(path)  # a traceback after Ray started, or a hang with the parent run RUNNING, before
    try:
        line = resume(stopped, capsys)
    finally:
        path.write_bytes(whole)
    assert said.format(path=path, trial=folder.parent.name.removeprefix("trial_")) in line
    parent, trials = stopped.runs()
    assert parent == "KILLED" and "RUNNING" not in trials.values()  # as the interrupt left them: not reopened


def test_an_optuna_study_cut_short_is_one_line(stopped, capsys, no_search):
    path = stopped.directory / "optuna.db"
    assert path.is_file()  # the search's live study, made before its first trial
    whole = cut_short(path)
    try:
        line = resume(stopped, capsys)
    finally:
        path.write_bytes(whole)
    assert f"the search's Optuna study sqlite:///{path} does not open (truncated: " in line
    assert "move it aside and --resume again" in line


def test_the_best_model_of_an_interrupted_search_is_one_line_without_a_progress_bar(stopped, capsys):
    with pytest.raises(UserError) as refused:
        load_best_model("faults", storage=stopped.root / "results")
    assert str(refused.value) == (
        'search "faults" has no best model: it was interrupted before its trials ended (its MLflow run is KILLED): '
        "continue it with --resume"
    )
    captured = capsys.readouterr()
    assert "Downloading artifacts" not in captured.err + captured.out  # guessed behind MLflow's bar before


def test_without_the_generators_state_resume_is_refused(stopped, capsys, no_search):
    (path,) = stopped.directory.glob("search_gen_state-*.json")
    aside = path.rename(stopped.root / path.name)
    try:
        line = resume(stopped, capsys)
    finally:
        aside.rename(path)
    assert line == (
        f"error: the state of the search's generator (search_gen_state-*.json) is missing from Tune's folder "
        f"{stopped.directory}: without it the trials not sampled yet would never be; restore it from a backup, or "
        "start the search anew with another --name"
    )


def test_with_tpes_state_moved_aside_resume_ends_the_search_with_a_new_tpe(stopped):
    (path,) = stopped.directory.glob("searcher-state-*.pkl")  # as the line about a corrupt one says to do
    path.rename(stopped.root / path.name)
    ray_tmp = tempfile.mkdtemp(prefix="vt3", dir="/tmp")  # a driver of its own: no stale copy in Ray's staging folder
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "vitplast_tune", "search", *stopped.argv, "--resume"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONPATH": os.pathsep.join(sys.path)},  # Tuner's callbacks
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]  # Tune's "Searcher unable to find checkpoint" before
    assert (
        f"note: TPE's state (searcher-state-*.pkl) is not in {stopped.directory}: a new TPE samples"
        in proc.stdout + proc.stderr
    )
    trials = pd.read_csv(stopped.directory / "trials.csv")
    assert len(trials) == 4 and trials["error"].isna().all() and trials["trial_id"].is_unique  # none repeated
    parent, runs = stopped.runs()
    assert parent == "FINISHED" and sorted(runs.values()) == ["FINISHED"] * 4


# ----------------------------------------------------------------------------- a disk that fills


@pytest.fixture
def disk(tmp_path):
    """A 48 MiB tmpfs at tmp_path/disk (mount needs root), unmounted after."""
    with small_disk(tmp_path / "disk") as mounted:
        yield mounted


class FillTheDisk(Callback):
    """At the first trial's first report, fill the search's disk to the last byte (a file that takes it all)."""

    def __init__(self, disk: Path):
        self.disk, self.filler = disk, disk / "filler"

    @property
    def full(self) -> bool:
        return self.filler.exists()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self.full:
            fill(self.disk)


def test_a_disk_that_fills_stops_the_search_as_an_interrupt_and_resume_loses_nothing(ray_local, disk):
    space = disk.parent / "space.yaml"
    space.write_text(SPACE.replace("max_steps: 16", "max_steps: 32").replace("num_samples: 4", "num_samples: 2"))
    storage = disk / "results"  # the search and its MLflow store on the small disk
    options = SearchOptions(space=str(space), name="full", storage=str(storage), plasticity=False, verbose=0)
    filling = FillTheDisk(disk)
    with pytest.raises(SearchInterrupted) as stopped:  # a traceback with three runs left RUNNING before
        run_search(options, callbacks=[filling])
    assert filling.full and stopped.value.exit_code == guard.EXIT_CODE
    text = str(stopped.value)
    assert text.startswith("No space left on device") and "stopped before its trials ended" not in text[:20]
    assert f"(the filesystem at {disk} is full)" in text  # the device to free, where the error names no file
    assert "nothing is lost: free space (or fix the filesystem), then continue the search with vitplast search" in text
    assert text.endswith("--resume") and "\n" not in text
    record = json.loads((storage / "full" / "vitplast_search.json").read_text())
    client = MlflowClient(record["tracking_uri"])
    statuses = {r.info.run_id: r.info.status for r in child_runs(client, record["parent_run_id"])}
    assert client.get_run(record["parent_run_id"]).info.status == "KILLED"
    assert statuses and set(statuses.values()) <= {"KILLED", "FAILED"}  # never RUNNING
    assert not (storage / "full" / ".driver.json").exists() and not (storage / "full" / guard.RESERVE_FILE).exists()

    filling.filler.unlink()  # space again: the same search resumes with what it recorded
    result = run_search(dataclasses.replace(options, resume=True))
    assert len(result.trials) == 2 and result.trials["error"].isna().all() and (result.trials["step"] == 32).all()
    finished = {r.info.run_id: r.info.status for r in child_runs(client, record["parent_run_id"])}
    assert set(statuses) <= set(finished) and len(finished) == 2  # the runs recorded before, continued
    assert set(finished.values()) == {"FINISHED"}
    assert client.get_run(record["parent_run_id"]).info.status == "FINISHED"
