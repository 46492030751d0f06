"""The search's Optuna study: written beside its results for every algorithm, opened by optuna.load_study, never
duplicated by a resume; and, after a real search, the importance on the parent run."""

import math

import optuna
import pandas as pd
import pytest
from _spaces import space_text
from mlflow.tracking import MlflowClient

from vitplast_tune.plan import SearchOptions
from vitplast_tune.records import summary, write_study
from vitplast_tune.records.study import (
    TRIAL_ATTR,
    describe_study,
    open_study,
    parameter_table,
    storage_url,
    study_parameters,
    trial_count,
)
from vitplast_tune.records.tracking import STUDY_TAG
from vitplast_tune.run.driver import run as run_search
from vitplast_tune.space import SearchSpec, load_space, parse_param
from vitplast_tune.space.files import SchedulerSpec

FLAGS = ["train_emb", "train_ln1", "train_mha", "train_ln2", "train_fc1", "train_fc2"]
TPE = dict(
    algorithm="optuna",
    num_samples=6,
    scheduler={"name": "asha", "grace_period": 8, "reduction_factor": 2},
    parameters={"components": {"subsets": "any"}, "lr": {"loguniform": [0.01, 0.3]}},
)


def table(rows):
    base = dict(max_steps=16, diverged=False, over_budget=False, error=None, test_acc=0.5, best_val_acc=0.6)
    return pd.DataFrame([{**base, **row} for row in rows])


ROWS = [
    dict(trial_id="a", components="mha+fc1", lr=0.1, step=16, val_acc=0.6, started_at=1.7e9, ended_at=1.7e9 + 42.5),
    dict(trial_id="b", components="fc2", lr=0.02, step=8, val_acc=0.3),  # stopped early by the scheduler
    dict(trial_id="c", components="all", lr=0.3, step=8, val_acc=math.nan, diverged=True),
    dict(trial_id="d", components="ln1", lr=0.05, step=0, val_acc=math.nan, over_budget=True),
    dict(trial_id="e", components="emb", lr=0.01, step=8, val_acc=math.nan, error="RayTaskError: boom"),
]
CURVES = {"a": {"val_acc": {8: 0.4, 16: 0.6}}, "b": {"val_acc": {8: 0.3}}, "c": {"val_acc": {8: 0.2}}}


def test_the_study_file_appears_whole_with_its_study_and_a_second_opening_makes_nothing(tmp_path, monkeypatch):
    """A reader that opens optuna.db as soon as it is there (the printed optuna-dashboard command, load_study while the
    search starts) must find its tables and the study made: Optuna's own opening would otherwise race to make them
    ("UNIQUE constraint failed: alembic_version")."""
    spec_path = tmp_path / "tpe.yaml"
    spec_path.write_text(space_text(**TPE))
    spec = load_space(str(spec_path))
    study_file, made = tmp_path / "search" / "optuna.db", []
    real = optuna.storages.RDBStorage.create_new_study

    def spy(self, *args, **kwargs):
        there = study_file.exists()  # is the file already where readers look, while its study is made?
        study_id = real(self, *args, **kwargs)  # raises where the study is there already (create_study's loading)
        made.append(there)
        return study_id

    monkeypatch.setattr(optuna.storages.RDBStorage, "create_new_study", spy)
    study = open_study(study_file.parent, "s", spec)
    assert made == [False] and trial_count(study_file, "s") == 0 and trial_count(study_file, "other") is None
    assert study.user_attrs == {"space": spec.name, "algorithm": spec.algorithm, "metric": spec.metric}
    assert sorted(p.name for p in study_file.parent.iterdir()) == ["optuna.db"]  # nothing left aside
    again = open_study(study_file.parent, "s", spec)
    assert made == [False] and again._study_id == study._study_id


def test_each_trial_is_one_optuna_trial_with_every_flag_and_resume_adds_only_new_ones(tmp_path):
    spec_path = tmp_path / "tpe.yaml"
    spec_path.write_text(space_text(**TPE))
    spec = load_space(str(spec_path))
    assert write_study(tmp_path, "s", spec, table(ROWS[:4]), CURVES) == 4
    assert storage_url(tmp_path) == f"sqlite:///{tmp_path.resolve()}/optuna.db"
    assert write_study(tmp_path, "s", spec, table(ROWS), CURVES) == 1  # a resumed search: one trial more
    assert trial_count(tmp_path / "optuna.db", "s") == 5
    line = f"Optuna study:       optuna-dashboard {storage_url(tmp_path)}   (study 's', 5 trials)"
    assert describe_study(tmp_path, "s") == line and describe_study(tmp_path, "other") is None
    loaded = optuna.load_study(study_name="s", storage=storage_url(tmp_path))
    by_id = {t.user_attrs[TRIAL_ATTR]: t for t in loaded.trials}
    assert sorted(by_id) == ["a", "b", "c", "d", "e"]
    states = {k: t.state.name for k, t in by_id.items()}
    assert states == {"a": "COMPLETE", "b": "PRUNED", "c": "FAIL", "d": "PRUNED", "e": "FAIL"}
    a = by_id["a"]
    assert a.params == {**dict.fromkeys(FLAGS, False), "train_mha": True, "train_fc1": True, "lr": 0.1}
    assert a.value == 0.6 and a.intermediate_values == {8: 0.4, 16: 0.6} and a.user_attrs["components"] == "mha+fc1"
    assert by_id["b"].value == 0.3 and by_id["d"].value is None  # pruned at its last report; never trained
    assert all(set(t.params) == {*FLAGS, "lr"} for t in loaded.trials)  # fc2 alone: every flag, fc2's True too
    assert by_id["b"].params["train_fc2"] is True
    assert loaded.direction == optuna.study.StudyDirection.MAXIMIZE and loaded.user_attrs["space"] == "tpe"
    durations = loaded.trials_dataframe().set_index("user_attrs_" + TRIAL_ATTR)["duration"]
    assert durations["a"] == pd.Timedelta(seconds=42.5)  # the Ray trial's start and end, not Optuna's "now" twice


def test_a_grid_study_has_the_grids_parameters():
    spec = SearchSpec(
        name="grid",
        path=None,
        description="",
        metric="val_acc",
        mode="max",
        algorithm="grid",
        num_samples=1,
        scheduler=SchedulerSpec(),
        parameters={
            "components": parse_param("components", {"choice": ["mha", "head", "all"]}, "x"),
            "lr": parse_param("lr", {"choice": [0.01, 0.1]}, "x"),
            "seed": parse_param("seed", {"choice": [0, 42]}, "x"),
            "optimizer": parse_param("optimizer", "sgd", "x"),
        },
    )
    assert list(study_parameters(spec)) == [*FLAGS, "lr", "seed"]  # constants are no parameters
    params = parameter_table(table([dict(components="head", lr=0.1, seed=42), dict(components="all")]), spec)
    assert not params.loc[0, FLAGS].any() and params.loc[1, FLAGS].all() and params.loc[0, "seed"] == 42


@pytest.fixture(scope="module")
def searched(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    space = root / "tpe.yaml"
    space.write_text(space_text(**TPE))
    options = SearchOptions(space=str(space), name="tpe", storage=str(root / "results"), plasticity=False, verbose=0)
    return options, run_search(options)


@pytest.mark.slow
def test_after_a_real_search_load_study_gives_every_trial_and_a_resume_adds_none(searched):
    options, found = searched
    trials = found.trials
    loaded = optuna.load_study(study_name="tpe", storage=storage_url(found.place.local_dir))
    assert len(loaded.trials) == len(trials) == len(found.study.trials) == 6
    by_id = {t.user_attrs[TRIAL_ATTR]: t for t in loaded.trials}
    assert sorted(by_id) == sorted(trials["trial_id"])
    for row in trials.itertuples():
        trial = by_id[row.trial_id]
        assert set(trial.params) == {*FLAGS, "lr"} and trial.params["lr"] == pytest.approx(row.lr)
        assert {c for c in ("emb", "ln1", "mha", "ln2", "fc1", "fc2") if trial.params[f"train_{c}"]} == set(
            row.components.replace("all", "emb+ln1+mha+ln2+fc1+fc2").split("+")
        )
        assert trial.state.name == ("COMPLETE" if row.step == 16 else "PRUNED") and trial.value == row.val_acc
        assert max(trial.intermediate_values) == row.step and trial.user_attrs["run_id"] == row.run_id
    assert (loaded.trials_dataframe()["duration"] > pd.Timedelta(0)).all()  # each trial's real start and end

    resumed = run_search(SearchOptions(**{**vars(options), "resume": True}))
    assert sorted(t.user_attrs[TRIAL_ATTR] for t in resumed.study.trials) == sorted(by_id)  # none added


@pytest.mark.slow
def test_the_parent_run_holds_the_importance_and_says_which_augmentation_ran(searched):
    _, found = searched
    client = MlflowClient(found.place.tracking_uri)
    parent = client.get_run(found.parent_run_id)
    assert parent.data.params["augment"] == "light" and parent.data.params["default.augment"] == "light"
    assert parent.data.tags[STUDY_TAG].startswith(storage_url(found.directory))
    artifacts = {a.path for a in client.list_artifacts(found.parent_run_id, "analysis")}
    assert {"analysis/importance.json", "analysis/importance.csv", "analysis/importance.png"} <= artifacts
    importance = found.analysis.importance.table
    assert set(importance["parameter"]) == {*FLAGS, "lr"} and importance["importance"].sum() == pytest.approx(1.0)
    text = summary(found)
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Search "))
    assert lines[0].startswith("Answer: finetune ") and head > 0  # the answer first, then the search's line
    assert "on digits, augmentation light)" in lines[head] and lines[head + 1].startswith("Time: ")
    assert "Which settings matter? fANOVA importance" in text
    assert f"optuna-dashboard {storage_url(found.directory)}   (study 'tpe', 6 trials)" in text
