"""What Optuna is told about each trial, and how a search's MLflow parent run is found and ended."""

import math
import os
from types import SimpleNamespace

import optuna
import pytest

from vitplast_tune.records import tracking
from vitplast_tune.records.tracking import (
    FAILURE_TAG,
    ROLE_TAG,
    SEARCH_ID_TAG,
    SEARCH_TAG,
    client,
    find_search_run,
    mark_failed,
    start_search_run,
)
from vitplast_tune.run import OptunaSearcher
from vitplast_tune.run.tuner import PENDING_ENV, tune_environment


def suggest_lr(trial) -> None:
    trial.suggest_float("lr", 0.01, 0.1)


def searcher() -> OptunaSearcher:
    found = OptunaSearcher(
        space=suggest_lr, metric="val_acc", mode="max", sampler=optuna.samplers.RandomSampler(seed=0)
    )
    for trial_id in ("stopped", "finished", "failed", "diverged"):
        assert found.suggest(trial_id) is not None
    return found


def report(found, trial_id, steps, max_steps=24, **extra):
    result = {}
    for i, step in enumerate(steps, 1):
        result = {"val_acc": step / 100, "step": step, "max_steps": max_steps, "training_iteration": i, **extra}
        found.on_trial_result(trial_id, result)
    return result


def test_optuna_is_told_pruned_complete_and_fail_with_intermediate_values_by_step():
    found = searcher()
    found.on_trial_complete("stopped", report(found, "stopped", [8]))  # ASHA stopped it at step 8 of 24
    found.on_trial_complete("finished", report(found, "finished", [8, 16, 24]))
    report(found, "failed", [8])
    found.on_trial_complete("failed", None, error=True)
    found.on_trial_complete("diverged", {"val_acc": math.nan, "diverged": 1, "step": 5, "max_steps": 24})
    trials = {t.number: t for t in found._ot_study.trials}
    stopped, finished, failed, diverged = (trials[i] for i in range(4))
    assert stopped.state == optuna.trial.TrialState.PRUNED and stopped.intermediate_values == {8: 0.08}
    assert finished.state == optuna.trial.TrialState.COMPLETE and finished.value == 0.24
    assert finished.intermediate_values == {8: 0.08, 16: 0.16, 24: 0.24}
    assert failed.state == diverged.state == optuna.trial.TrialState.FAIL


@pytest.fixture
def mlflow(tmp_path):
    return client(f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_the_parent_run_is_found_by_its_unique_search_id(mlflow):
    for search_id in ("id-one", "id-two"):  # two searches of one name on a shared server
        start_search_run(mlflow, "exp", "same-name", {}, {SEARCH_ID_TAG: search_id})
    found = find_search_run(mlflow, "exp", "same-name", search_id="id-two")
    assert mlflow.get_run(found).data.tags[SEARCH_ID_TAG] == "id-two"
    assert find_search_run(mlflow, "exp", "same-name") is None  # ambiguous: not guessed
    assert find_search_run(mlflow, "exp", "same-name", search_id="id-three") is None


def test_the_parent_run_is_found_by_name_beside_its_trials_which_carry_the_name_too(mlflow):
    parent = start_search_run(mlflow, "exp", "solo", {}, {})
    experiment = mlflow.get_run(parent).info.experiment_id
    for _ in range(2):
        mlflow.create_run(experiment, tags={SEARCH_TAG: "solo", ROLE_TAG: "trial"})
    assert find_search_run(mlflow, "exp", "solo") == parent


def test_a_failed_search_marks_its_parent_run_failed_with_the_reason(mlflow):
    run_id = start_search_run(mlflow, "exp", "s", {}, {})
    mark_failed(mlflow, run_id, RuntimeError("the cluster went away\ntraceback lines"))
    run = mlflow.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[FAILURE_TAG] == "RuntimeError: the cluster went away"


def test_tune_environment_is_set_while_it_runs_and_restored_after(monkeypatch):
    # An in-process search once left TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1 behind: a later plain Tuner in the same
    # process then wrote no result.json (the checkpoint cadence test failed beside another test file).
    for key in ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", PENDING_ENV, "RAY_AIR_NEW_OUTPUT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "7")  # the user's value wins
    plan = SimpleNamespace(spec=SimpleNamespace(algorithm="optuna", total_trials=12), max_concurrent=None)
    before = dict(os.environ)
    with tune_environment(plan, cluster_grows=True) as set_here:
        assert set_here == {  # MLflow's calls bounded too (records.tracking), none of them set by the user here
            "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
            "RAY_AIR_NEW_OUTPUT": "0",
            PENDING_ENV: "12",
            **{k: v for k, v in tracking.BOUNDED_ENV.items() if k not in before},
        }
        assert os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] == "1" and os.environ[PENDING_ENV] == "12"
        assert os.environ["TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S"] == "7"
    assert dict(os.environ) == before
    with tune_environment(plan, cluster_grows=False) as set_here:  # a fixed cluster: Tune's own default
        assert PENDING_ENV not in set_here and PENDING_ENV not in os.environ
    assert dict(os.environ) == before
