"""One MLflow run per trial, whatever a killed driver left: a driver SIGKILLed between making a trial's run and
Tune's next save of its state leaves a RUNNING run of a trial Tune never saved. Planted here (that moment cannot be
hit on purpose): a resumed search continues such a run for the trial that takes up its settings, closes and removes
one no trial takes up, and ends with exactly one run per trial, none RUNNING. (The tracking server restarted
mid-search: ``test_service_faults.py``.)"""

from __future__ import annotations

import dataclasses
import json

import pytest
from _spaces import space_text
from mlflow.tracking import MlflowClient
from ray.tune import Callback, ExperimentAnalysis

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import SearchInterrupted
from vitplast_tune.plan import SearchOptions
from vitplast_tune.records import trial_runs
from vitplast_tune.records.tracking import PARENT_TAG, ROLE_TAG, SEARCH_TAG, TRIAL_TAG, child_runs, log_params
from vitplast_tune.run import interrupts
from vitplast_tune.run.driver import run as run_search

pytestmark = pytest.mark.slow
SPACE = space_text(
    algorithm="grid",
    parameters={"components": {"choice": ["mha", "fc1"]}, "lr": {"choice": [0.05]}},
    defaults={"max_steps": 24, "eval_every": 8},
)


class StopAtFirstCheckpoint(Callback):
    """Ctrl-C as Tune takes it, once the first trial has reported a checkpoint."""

    def __init__(self):
        self.stopped = False

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get("checkpoint_dir_name") and not self.stopped:
            self.stopped = True
            interrupts.stop_tune()


class NoScores:
    """Predictors without scores: a trial's params alone (``trial_runs.trial_describer``)."""

    def trial_scores(self, cfg):
        return {}


def plant_orphan(client: MlflowClient, parent: str, name: str, trial_id: str, params: dict) -> str:
    """A RUNNING trial run of ``trial_id`` (a trial Tune never saved) under ``parent``, as a killed driver left it."""
    experiment = client.get_run(parent).info.experiment_id
    tags = {PARENT_TAG: parent, TRIAL_TAG: trial_id, ROLE_TAG: "trial", SEARCH_TAG: name}
    run_id = client.create_run(experiment, tags=tags).info.run_id
    log_params(client, run_id, params)
    return run_id


def test_runs_a_killed_driver_left_are_continued_or_closed_and_each_trial_keeps_one(ray_local, tmp_path):
    (tmp_path / "space.yaml").write_text(SPACE)
    options = SearchOptions(
        space=str(tmp_path / "space.yaml"),
        name="orphans",
        storage=str(tmp_path / "results"),
        max_concurrent=1,
        plasticity=False,
        verbose=0,
    )
    with pytest.raises(SearchInterrupted):
        run_search(options, callbacks=[StopAtFirstCheckpoint()])
    directory = tmp_path / "results" / "orphans"
    record = json.loads((directory / "vitplast_search.json").read_text())
    client, parent = MlflowClient(record["tracking_uri"]), record["parent_run_id"]
    (first,) = ExperimentAnalysis(str(directory)).trials[:1]
    describe = trial_runs.trial_describer("orphans", FinetuneConfig.from_dict(record["settings"]), NoScores())
    other = {**first.config, "components": "fc1" if first.config["components"] == "mha" else "mha"}
    same = plant_orphan(client, parent, "orphans", "killed00_00007", describe(first.config).params)
    taken = plant_orphan(client, parent, "orphans", "killed00_00008", describe(other).params)

    result = run_search(dataclasses.replace(options, resume=True))
    assert len(result.trials) == 2 and (result.trials["step"] == 24).all() and result.trials["error"].isna().all()
    runs = {r.info.run_id: r for r in child_runs(client, parent)}
    assert sorted(r.data.tags[TRIAL_TAG] for r in runs.values()) == sorted(result.trials["trial_id"])  # one each
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    assert taken in runs and runs[taken].data.tags[trial_runs.EARLIER_TRIAL_TAG] == "killed00_00008"  # continued
    removed = client.get_run(same)  # its settings' trial kept its own run: this one closed and removed
    assert removed.info.status == "KILLED" and removed.info.lifecycle_stage == "deleted"
    assert "never saved by Tune" in removed.data.tags[trial_runs.SUPERSEDED_TAG]
    assert client.get_run(parent).info.status == "FINISHED"
