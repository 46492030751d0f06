"""A tracking server that goes away while a search runs (a real ``mlflow server`` on 127.0.0.1, stopped at the first
trial's first report): the search notices it at its next MLflow call, stops as an interrupt does and prints the
command that resumes it; with the server back, that command ends the search with one MLflow run per trial, none
RUNNING."""

from __future__ import annotations

import dataclasses

import pytest
from _services import MlflowServer
from _spaces import space_text
from mlflow.tracking import MlflowClient
from ray.tune import Callback

from vitplast_tune.errors import SearchInterrupted
from vitplast_tune.plan import SearchOptions
from vitplast_tune.records.tracking import ROLE_TAG, SEARCH_TAG, TRIAL_TAG, child_runs
from vitplast_tune.run import guard
from vitplast_tune.run.driver import run as run_search

pytestmark = pytest.mark.slow
SPACE = space_text(
    algorithm="grid",
    parameters={"components": {"choice": ["mha", "fc1"]}, "lr": {"choice": [0.05]}},
    defaults={"max_steps": 24, "eval_every": 8},
)


class StopTheServer(Callback):
    """At the first trial's first report (its MLflow run made), stop the tracking server the search writes to."""

    def __init__(self, server: MlflowServer):
        self.server, self.stopped = server, False

    def __getstate__(self) -> dict:  # Tune pickles its callbacks; the server's process stays here
        return {"server": None, "stopped": self.stopped}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self.stopped:
            self.stopped = True
            self.server.stop()


def test_a_tracking_server_stopped_mid_search_stops_it_and_resume_keeps_one_run_per_trial(
    ray_local, tmp_path, monkeypatch
):
    # One retry, not the search's six (about a minute of backoff against a refused port, records.tracking): a user's
    # setting wins, and the way a call that fails is noticed is the same.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    server = MlflowServer(f"sqlite:///{tmp_path / 'server.db'}", None, "artifacts", tmp_path)
    try:
        (tmp_path / "space.yaml").write_text(SPACE)
        options = SearchOptions(
            space=str(tmp_path / "space.yaml"),
            name="gone",
            storage=str(tmp_path / "results"),
            tracking_uri=server.url,
            max_concurrent=1,
            plasticity=False,
            verbose=0,
        )
        stop = StopTheServer(server)
        with pytest.raises(SearchInterrupted) as stopped:  # minutes of silence before, then runs left RUNNING
            run_search(options, callbacks=[stop])
        assert stop.stopped and stopped.value.exit_code == guard.SERVICE_EXIT_CODE
        text = str(stopped.value)
        assert text.startswith("the MLflow tracking store did not answer (") and "\n" not in text, text
        assert "start the MLflow tracking server (or its database) again, then continue the search with" in text
        assert text.endswith("--resume")

        server.start()  # back on the same port with the same store: the printed command continues the search
        result = run_search(dataclasses.replace(options, resume=True, tracking_uri=None))
        assert len(result.trials) == 2 and (result.trials["step"] == 24).all() and result.trials["error"].isna().all()
        client = MlflowClient(server.url)
        runs = child_runs(client, result.parent_run_id)
        trials = sorted(r.data.tags[TRIAL_TAG] for r in runs)
        assert trials == sorted(result.trials["trial_id"])  # one run per trial: none duplicated, none left over
        assert {r.info.status for r in runs} == {"FINISHED"}
        assert client.get_run(result.parent_run_id).info.status == "FINISHED"
        searches = client.search_runs(
            [r.info.experiment_id for r in runs[:1]],
            filter_string=f"tags.`{SEARCH_TAG}` = 'gone' and tags.`{ROLE_TAG}` = 'search'",
        )
        assert len(searches) == 1  # the resumed search found its parent run again
    finally:
        server.stop()
