"""The saved MLflow UI view of a search: its state, its link, and the fallback for an unknown MLflow version."""

import json
from urllib.parse import parse_qs, urlsplit

import pytest
from mlflow.tracking import MlflowClient

from vitplast_tune._compat import mlflow as mlflow_module
from vitplast_tune._compat.mlflow import VIEW_TAG_PREFIX, view_supported
from vitplast_tune.records import ui_command
from vitplast_tune.records.view import KIND_TAG, publish, run_link, search_filter, ui_base_url, view_link, view_state
from vitplast_tune.search_names import view_key


def test_ui_base_url_is_the_tracking_server_or_the_mlflow_ui_default():
    assert ui_base_url("http://10.0.0.5:8080/") == "http://10.0.0.5:8080"
    assert ui_base_url("https://mlflow.example.org/prefix") == "https://mlflow.example.org/prefix"
    assert ui_base_url("sqlite:////tmp/mlflow.db") == "http://127.0.0.1:5000"


def test_supported_versions():
    assert view_supported("3.17.2") and view_supported("3.18.0")  # 3.18's bundle reads 3.17's format
    assert not view_supported("2.16.0") and not view_supported("3.19.0")


def test_run_links_open_in_model_training_mode():
    link = run_link("http://127.0.0.1:5000/", "3", "abc")
    assert link == "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"


def test_view_state_without_plasticity_has_no_plasticity_chart_or_column():
    state = view_state("s", plasticity=False)
    assert "metrics.`plasticity_mean`" not in state["selectedColumns"]
    axes = [c["xaxis"]["key"] for c in state["compareRunCharts"] if c["type"] == "SCATTER"]
    assert axes == ["log10_trainable_params"]
    assert "metrics.`plasticity_mean`" in view_state("s", plasticity=True)["selectedColumns"]


def test_publish_saves_the_view_for_a_known_version(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'db.sqlite'}")
    experiment = client.create_experiment("e", artifact_location=str(tmp_path / "a"))
    view = publish(client, experiment, "my search", True, "http://127.0.0.1:5000")
    tags = client.get_experiment(experiment).tags
    key = view_key("my search")
    envelope = json.loads(tags[VIEW_TAG_PREFIX + key])
    assert envelope["name"] == "vitplast_tune: my search" and isinstance(envelope["createdAt"], int)
    state = json.loads(envelope["state"])  # what MLflow's UI reads, written out here rather than rebuilt by the code
    assert state["searchFilter"] == "tags.`vitplast.search` = 'my search' and tags.`vitplast.role` = 'trial'"
    assert state["orderByKey"] == "metrics.`val_acc_common`" and state["orderByAsc"] is False
    assert state["selectedColumns"] == [
        "attributes.`Dataset`",
        "params.`components`",
        "params.`lr`",
        "metrics.`best_val_acc`",
        "metrics.`val_acc_common`",
        "metrics.`plasticity_mean`",
        "metrics.`trainable_params`",
    ]
    assert {c["type"] for c in state["compareRunCharts"]} >= {"SCATTER", "PARALLEL"}
    assert tags[KIND_TAG] == "custom_model_development"
    query = parse_qs(urlsplit(view.link).fragment.split("?", 1)[1])
    assert view.saved and query["viewStateShareKey"] == [key] and query["workflowType"] == ["machine_learning"]


def test_unknown_version_falls_back_to_the_plain_link_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setattr(mlflow_module, "VIEW_FORMAT_VERSIONS", ("0.1",))
    client = MlflowClient(f"sqlite:///{tmp_path / 'db.sqlite'}")
    experiment = client.create_experiment("e", artifact_location=str(tmp_path / "a"))
    view = publish(client, experiment, "s", True, "http://127.0.0.1:5000")
    assert not view.saved and "not one this knows" in view.note and "is not supported for the saved view" in view.note
    assert not any(k.startswith(VIEW_TAG_PREFIX) for k in client.get_experiment(experiment).tags)
    query = parse_qs(urlsplit(view.link).fragment.split("?", 1)[1])
    assert query["searchFilter"] == [search_filter("s")] and "viewStateShareKey" not in query


def test_the_view_link_found_again_is_the_saved_view_or_else_the_filtered_trials(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'db.sqlite'}")
    experiment = client.create_experiment("e", artifact_location=str(tmp_path / "a"))
    base = "http://127.0.0.1:5001"
    plain = parse_qs(urlsplit(view_link(client, experiment, "s", base)).fragment.split("?", 1)[1])
    assert "viewStateShareKey" not in plain and plain["searchFilter"] == [search_filter("s")]
    saved = publish(client, experiment, "s", True, base)
    assert view_link(client, experiment, "s", base) == saved.link and saved.experiment_id == experiment


def test_the_ui_command_names_the_search_and_its_storage_unless_a_server_records_it(tmp_path, monkeypatch):
    from vitplast_tune.storage import SearchPlace

    monkeypatch.setenv("VITPLAST_RESULTS_DIR", str(tmp_path / "default"))
    plan = lambda uri, storage: SearchPlace("s", str(storage), uri, "e")
    sqlite = f"sqlite:///{tmp_path / 'm.db'}"
    assert ui_command(plan(sqlite, tmp_path / "default")) == "vitplast ui s"
    assert ui_command(plan(sqlite, tmp_path / "other")) == f"vitplast ui s --storage {tmp_path / 'other'}"
    assert ui_command(plan(sqlite, "s3://b/r")) == f"mlflow ui --backend-store-uri {sqlite} --host 127.0.0.1"
    assert ui_command(plan("http://127.0.0.1:5000", tmp_path / "default")) is None


def test_paths_print_as_a_user_types_them_and_a_shell_reads_them_back(tmp_path, monkeypatch):
    """A store under the home folder printed as ``sqlite:////home/me/...`` (four slashes, issue 57) reads as a typo:
    it prints as ``~/...``, or ``sqlite:///$HOME/...`` in a URL, which the shell turns back into the same store."""
    import subprocess

    from vitplast_tune.storage import SearchPlace, spoken

    home = tmp_path / "me"
    monkeypatch.setenv("HOME", str(home))
    uri = f"sqlite:///{home / 'results' / 'mlflow.db'}"
    assert spoken(uri) == "sqlite:///$HOME/results/mlflow.db" and spoken(home / "results" / "q") == "~/results/q"
    assert [spoken(t) for t in (f"{home}x/a", "s3://b/r", "sqlite:////srv/m.db")] == [
        f"{home}x/a",
        "s3://b/r",
        "sqlite:////srv/m.db",
    ]
    typed = subprocess.run(
        ["bash", "-c", f"echo {spoken(uri)} {spoken(home / 'results')}"], capture_output=True, text=True
    )
    assert typed.stdout.split() == [uri, str(home / "results")]
    place = SearchPlace("s", str(home / "results"), uri, "e")
    assert ui_command(place) == "vitplast ui s --storage ~/results"


@pytest.mark.slow
def test_a_search_on_an_mlflow_whose_ui_format_is_unknown_says_so_and_links_the_filtered_trials(
    ray_local, tiny_space, tmp_path, monkeypatch, library_log
):
    """End to end, pretending another MLflow: no view is written, the search says why as it starts and in its
    summary, and every link it gives (the log line, the parent run's tag and description, the summary) is the runs
    page filtered to the search's trials and sorted by accuracy."""
    from vitplast_tune.plan import SearchOptions
    from vitplast_tune.records import summary
    from vitplast_tune.records.tracking import NOTE_TAG, VIEW_LINK_TAG
    from vitplast_tune.run.driver import run as run_search

    monkeypatch.setattr(mlflow_module, "installed_version", lambda: "3.19.0")
    space = tiny_space(parameters={"components": {"choice": ["fc1"]}}, defaults={"max_steps": 8, "eval_every": 8})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    options = SearchOptions(
        space=str(space), name="other", storage=str(tmp_path / "r"), tracking_uri=uri, plasticity=False, verbose=0
    )
    result = run_search(options)
    client = MlflowClient(uri)
    parent = client.get_run(result.parent_run_id)
    assert not any(k.startswith(VIEW_TAG_PREFIX) for k in client.get_experiment(parent.info.experiment_id).tags)
    link = result.view.link
    query = parse_qs(urlsplit(link).fragment.split("?", 1)[1])
    assert query["searchFilter"] == [search_filter("other")] and "viewStateShareKey" not in query
    assert query["orderByKey"] == ["metrics.`val_acc_common`"] and query["orderByAsc"] == ["false"]
    note = "MLflow 3.19.0 is not supported for the saved view (supported: 3.17, 3.18"
    said = [m for m in library_log if "MLflow 3.19.0 is not supported" in m]
    assert len(said) == 1 and note in said[0]
    assert any(m.startswith("MLflow view (fills in as trials report") and m.endswith(link) for m in library_log)
    assert parent.data.tags[VIEW_LINK_TAG] == link and link in parent.data.tags[NOTE_TAG]
    text = summary(result)
    assert f"MLflow view:        {link}" in text and note in text


def test_the_experiment_kind_set_by_another_search_at_once_is_not_an_error():
    """Two searches starting at once on one server: the second's insert of the tag is refused (a unique key), the tag
    is read again and found set."""
    from types import SimpleNamespace

    from mlflow.exceptions import MlflowException

    from vitplast_tune.records.view import KIND, KIND_TAG, mark_model_training

    class Racing:
        tags: dict = {}
        calls = 0

        def get_experiment(self, experiment_id):
            return SimpleNamespace(tags=dict(self.tags))

        def set_experiment_tag(self, experiment_id, key, value):
            self.calls += 1
            self.tags = {key: value}  # the other search's insert landed first
            raise MlflowException("duplicate key value violates unique constraint experiment_tag_pk")

    client = Racing()
    mark_model_training(client, "1")
    assert client.tags == {KIND_TAG: KIND} and client.calls == 1

    class Refusing(Racing):
        def set_experiment_tag(self, experiment_id, key, value):
            self.calls += 1
            raise MlflowException("refused")

    client = Refusing()
    with pytest.raises(MlflowException):
        mark_model_training(client, "1", tries=2)
    assert client.calls == 2


def test_a_new_experiment_is_model_training_and_a_kind_a_user_chose_is_kept(tmp_path):
    """The search creates its experiment with the kind MLflow's fix for the UI reads (mlflow/mlflow#24493); a kind a
    user set on an experiment is kept, the UI's own guess (``*_inferred``) is replaced."""
    from vitplast_tune.records.tracking import experiment_id

    client = MlflowClient(f"sqlite:///{tmp_path / 'db.sqlite'}")
    created = experiment_id(client, "new", str(tmp_path / "a"))
    assert client.get_experiment(created).tags[KIND_TAG] == "custom_model_development"
    for kind, kept in (("genai_development", True), ("genai_development_inferred", False), ("", False)):
        experiment = client.create_experiment(f"user's {kind}", artifact_location=str(tmp_path / "b"))
        client.set_experiment_tag(experiment, KIND_TAG, kind)
        assert experiment_id(client, f"user's {kind}") == experiment
        publish(client, experiment, "s", True, "http://127.0.0.1:5000")
        assert client.get_experiment(experiment).tags[KIND_TAG] == (kind if kept else "custom_model_development")
