"""MLflow records from the driver, on a real SQLite store: where an experiment's artifacts go, and what a trial's run
holds while it trains (what the view's charts plot)."""

import contextlib
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

from mlflow.tracking import MlflowClient

from vitplast_tune.records import MlflowTracker
from vitplast_tune.records.tracking import artifact_location, experiment_id
from vitplast_tune.records.trial_runs import TrialRun, log_trial_finals


def test_artifacts_go_beside_a_sqlite_store_or_under_the_storage_never_the_working_directory(tmp_path):
    storage = str(tmp_path / "results")
    beside = artifact_location(f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}", "vitplast_tune", storage)
    assert beside == str(tmp_path / "db" / "mlartifacts" / "vitplast_tune")
    relative = artifact_location("sqlite:///here/mlflow.db", "vitplast_tune", storage)  # cwd: tmp_path
    assert relative == str(tmp_path / "here" / "mlartifacts" / "vitplast_tune")
    for server in ("http://127.0.0.1:5000", "https://mlflow.example.org", "databricks", "file:///tmp/store"):
        assert artifact_location(server, "vitplast_tune", storage) is None  # the server's (or store's) own
    other = artifact_location("postgresql://u@db/mlflow", "vitplast_tune", storage)
    assert other == f"{storage}/mlartifacts/vitplast_tune"
    assert artifact_location("mysql://db/x", "e", "s3://bucket/runs") == "s3://bucket/runs/mlartifacts/e"
    memory = artifact_location("sqlite:///:memory:", "e", storage)
    assert memory == f"{storage}/mlartifacts/e"


def test_experiment_folders_are_safe_and_unique_names():
    def digest(name):
        return hashlib.sha256(name.encode()).hexdigest()[:8]

    where = lambda name: Path(artifact_location("sqlite:////db/m.db", name, "/r")).name
    assert where("vitplast_tune") == "vitplast_tune" and where("a.b-c_1") == "a.b-c_1"
    assert where("team runs") == f"team-runs-{digest('team runs')}" != where("team-runs")
    assert where("../x") == f"x-{digest('../x')}"
    assert where("12") == f"12-{digest('12')}"  # never digits alone: an mlflow server's own folders are experiment ids
    long = "e" * 500  # as long as MLflow takes: a folder name of at most 255 bytes, still one per name
    assert where(long) == f"{'e' * 200}-{digest(long)}" != where("e" * 499)


def test_a_new_experiment_keeps_its_artifacts_where_it_was_told(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    client = MlflowClient(uri)
    location = artifact_location(uri, "e", str(tmp_path / "results"))
    experiment = experiment_id(client, "e", location)
    assert experiment_id(client, "e", "/elsewhere") == experiment  # an existing one keeps its location
    run = client.create_run(experiment).info.run_id
    client.log_text(run, "hello", "note.txt")
    assert (Path(location) / run / "artifacts" / "note.txt").read_text() == "hello"
    assert not (tmp_path / "mlruns").exists()  # the working directory (tmp_path) holds nothing of it


def test_an_experiment_another_driver_made_between_the_lookup_and_the_create_is_used(tmp_path, monkeypatch):
    """Two searches starting at once on one store: the second's create meets the first's experiment, and uses it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = MlflowClient(uri).create_experiment("team")
    second = MlflowClient(uri)
    looked = []
    real = second.get_experiment_by_name

    def raced(name):  # the lookup ran before the other driver's create
        looked.append(name)
        return None if len(looked) == 1 else real(name)

    monkeypatch.setattr(second, "get_experiment_by_name", raced)
    assert experiment_id(second, "team") == first and looked == ["team", "team"]
    assert [e.name for e in MlflowClient(uri).search_experiments()].count("team") == 1


def test_a_trials_run_holds_what_the_view_plots_from_its_first_report(tmp_path):
    """val_acc_common, trainable_params and log10_trainable_params as the trial reports (the charts fill in while it
    runs); the search's end replaces val_acc_common by the accuracy at the common step."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    parent = client.create_run(experiment_id(client, "e", str(tmp_path / "a"))).info.run_id
    describe = lambda config: TrialRun("mha lr=0.1", {"lr": 0.1}, {"plasticity_mean": 1.5})
    tracker = MlflowTracker(uri, parent, describe)
    trial = SimpleNamespace(trial_id="t1", config={})
    for step, acc in ((8, 0.25), (16, 0.5)):
        report = {"step": step, "val_acc": acc, "trainable_params": 1000, "train_loss": 1.0}
        tracker.on_trial_result(0, [trial], trial, report)
        metrics = client.get_run(tracker.runs["t1"]).data.metrics
        assert metrics["val_acc_common"] == acc and metrics["trainable_params"] == 1000
        assert metrics["log10_trainable_params"] == math.log10(1000) and metrics["plasticity_mean"] == 1.5
    row = SimpleNamespace(run_id=tracker.runs["t1"], step=16, val_acc_common=0.25, common_step=8)
    log_trial_finals(client, _frame(row))
    assert client.get_run(tracker.runs["t1"]).data.metrics["val_acc_common"] == 0.25  # the common step's, at the end


def _frame(row):
    import pandas as pd

    return pd.DataFrame([vars(row)])


@contextlib.contextmanager
def another_client_first(kind: type, write: Callable[[], None]) -> Iterator[list[str]]:
    """While in the block, the first flush that inserts a ``kind`` record runs ``write`` (another client's) first:
    the race of two writers on one store, between MLflow's look for the record and its insert, made to happen."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    raced: list[str] = []

    def theirs_first(session, *args):
        if not raced and any(isinstance(o, kind) for o in session.new):
            raced.append(kind.__name__)
            write()

    event.listen(Session, "before_flush", theirs_first)
    try:
        yield raced
    finally:
        event.remove(Session, "before_flush", theirs_first)


def test_a_record_another_search_writes_between_mlflows_check_and_insert_is_taken_as_written(tmp_path):
    """Two searches on one store write the same record at once: the other's insert lands between MLflow's look and
    its own insert, and MLflow refuses ours on the record's key. A dataset input: the trial's run is made all the
    same, with both inputs; a saved view of the same name: ours replaces theirs."""
    from mlflow.store.tracking.dbmodels.models import SqlDataset, SqlExperimentTag

    from vitplast_tune._compat import mlflow as mlflow_internals
    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.records import view
    from vitplast_tune.records.trial_runs import dataset_inputs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ours, theirs = MlflowClient(uri), MlflowClient(uri)
    experiment = experiment_id(ours, "team", str(tmp_path / "a"))
    parent, other = (c.create_run(experiment).info.run_id for c in (ours, theirs))
    inputs = dataset_inputs(FinetuneConfig())
    tracker = MlflowTracker(uri, parent, lambda config: TrialRun("mha", {"lr": 0.1}, {}, inputs=inputs))
    with another_client_first(SqlDataset, lambda: theirs.log_inputs(other, datasets=inputs)) as raced:
        run_id = tracker.run_id(SimpleNamespace(trial_id="t1", config={}))
    assert raced == ["SqlDataset"]
    for run in (run_id, other):
        logged = ours.get_run(run).inputs.dataset_inputs
        assert sorted(i.dataset.name for i in logged) == ["digits-train", "digits-val"]

    tag = mlflow_internals.VIEW_TAG_PREFIX + "k"
    with another_client_first(SqlExperimentTag, lambda: theirs.set_experiment_tag(experiment, tag, "theirs")) as raced:
        view.save_view(ours, experiment, "k", "ours", {})
    assert raced == ["SqlExperimentTag"]
    assert json.loads(ours.get_experiment(experiment).tags[tag])["name"] == "ours"
