"""Validation before anything starts: metric and mode, the scheduler's budget, weights files, resume state."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _servers import MLFLOW_API, http_server
from _spaces import space_text

from vitplast_tune import storage
from vitplast_tune.config import PlasticityInputs
from vitplast_tune.errors import UserError, flags_spoken
from vitplast_tune.plan import EXPERIMENT, SearchOptions, SearchPlan, prepare
from vitplast_tune.predictors import cache
from vitplast_tune.storage import write_record
from vitplast_tune.vit import models


def options(tmp_path, metric="val_acc", mode="max", **kw) -> SearchOptions:
    space = tmp_path / "space.yaml"
    space.write_text(
        space_text(
            metric=metric,
            mode=mode,
            algorithm="optuna",
            num_samples=3,
            scheduler={"name": "asha", "grace_period": 100, "reduction_factor": 3},
            parameters={"components": {"subsets": "any"}, "lr": {"loguniform": [1.0e-3, 1.0]}},
            defaults={"max_steps": 400},
        )
    )
    kw = {"name": "s", "settings": {}, **kw}
    return SearchOptions(space=str(space), storage=str(tmp_path / "results"), plasticity=False, **kw)


@pytest.mark.parametrize(
    "metric, mode, message",
    [
        ("accuracy", "max", 'metric "accuracy" is not reported by trials'),
        ("test_acc", "max", "use one of val_acc"),  # only the last report has it: a scheduler would fail mid-search
        ("val_acc", "min", 'mode "min" would search for the worst val_acc; use mode: max'),
        ("val_loss", "max", "use mode: min"),
    ],
)
def test_metric_and_mode_must_be_what_trials_report(tmp_path, metric, mode, message):
    with pytest.raises(UserError, match=message):
        prepare(options(tmp_path, metric, mode))


def test_the_plan_is_one_frozen_value_with_its_corner_trials_resolved_once(tmp_path):
    prepared = prepare(options(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        prepared.notes = ()  # the run, the records and the analysis read it; nothing changes it after prepare
    assert prepared.corners  # every subset and both ends of the learning rate, checked against the model before Ray
    assert {c.lr for c in prepared.corners} == {1.0e-3, 1.0}
    assert all(c.max_steps == 400 and c.model == prepared.settings.model for c in prepared.corners)


def test_a_grace_period_above_the_budget_is_clamped_and_said_once(tmp_path):
    prepared = prepare(options(tmp_path, settings={"max_steps": 40}))
    assert prepared.spec.scheduler.grace_period == 40 and prepared.spec.scheduler.name == "asha"
    assert prepared.notes == (
        "scheduler grace_period 100 is above max_steps 40: using 40, so no trial is stopped early",
    )
    assert prepare(options(tmp_path, name="other")).notes == ()  # 400 steps: the space's 100 stands


@pytest.mark.parametrize(
    "suffix, content",
    [
        (".safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json"),
        (".pt", b"PK\x03\x04 truncated zip"),
        (".bin", b""),
    ],
)
def test_a_corrupt_weights_file_is_a_user_error(tmp_path, suffix, content):
    path = tmp_path / f"weights{suffix}"
    path.write_bytes(content)
    with pytest.raises(UserError, match="is unreadable or corrupt"):
        models.check_weights("vit_testbed_patch8_32", path, True)


def test_a_torch_file_that_is_no_state_dict_is_a_user_error(tmp_path):
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(UserError, match="not a state dict"):
        models.check_weights("vit_testbed_patch8_32", tmp_path / "list.pt", True)


def started(tmp_path, **kw) -> SearchPlan:
    """A search that was started (its record written) with ``kw``."""
    first = prepare(options(tmp_path, **kw))
    write_record(first.local_dir, first.record("parent-run"))
    return first


def test_resume_keeps_the_recorded_settings_and_identity(tmp_path):
    first = started(tmp_path, settings={"max_steps": 40}, seed=3, max_concurrent=2)
    resumed = prepare(options(tmp_path, resume=True))
    assert resumed.settings == first.settings and resumed.settings.max_steps == 40
    assert (resumed.seed, resumed.max_concurrent, resumed.search_id) == (3, 2, first.search_id)
    assert resumed.spec.scheduler.grace_period == 40  # the recorded budget, not the space's 400
    assert len(first.search_id) == 32 and prepare(options(tmp_path, name="new")).search_id != first.search_id


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(settings={"max_steps": 80}), "max_steps=80 differs from the 40"),
        (dict(settings={"model": "vit_tiny_patch16_224"}), "model='vit_tiny_patch16_224' differs"),
        (dict(settings={"dataset": "fractals"}), "dataset='fractals' differs"),
        (dict(num_samples=9), "num_samples=9 differs from the 3"),
        (dict(max_concurrent=1), "max_concurrent=1 differs from the None"),
        (dict(seed=4), "seed=4 differs from the 0"),
        (dict(tracking_uri="sqlite:////tmp/elsewhere.db"), "tracking_uri='sqlite:////tmp/elsewhere.db' differs"),
        (dict(experiment="other"), "experiment='other' differs from the 'vitplast_tune'"),
        (dict(objective="accuracy_per_gpu_hour"), "objective='accuracy_per_gpu_hour' differs from the 'accuracy'"),
    ],
)
def test_resume_refuses_a_change_that_would_make_the_search_inconsistent(tmp_path, change, message):
    started(tmp_path, settings={"max_steps": 40})
    with pytest.raises(UserError, match=message):
        prepare(options(tmp_path, resume=True, **change))


def test_a_resume_optimises_what_the_search_started_with(tmp_path):
    """A search started with --objective accuracy_per_gpu_hour resumes with it, without the flag: one study, one
    objective; giving it again is no change."""
    first = started(tmp_path, settings={"max_steps": 40}, objective="accuracy_per_gpu_hour")
    for given in (None, "accuracy_per_gpu_hour"):
        resumed = prepare(options(tmp_path, resume=True, objective=given))
        assert (resumed.spec.metric, resumed.spec.mode) == (first.spec.metric, first.spec.mode) != ("val_acc", "max")


def test_resume_refuses_other_workers_per_trial_than_the_search_started_with(tmp_path):
    first = started(tmp_path, workers_per_trial=2, cpus_per_trial=2)
    assert first.record("r")["workers_per_trial"] == 2
    with pytest.raises(
        UserError, match=r"started with 2 worker\(s\) per trial .* on 1; resume with workers_per_trial=2"
    ):
        prepare(options(tmp_path, resume=True, cpus_per_trial=2))  # a bare resume after SIGKILL: one worker
    assert prepare(options(tmp_path, resume=True, workers_per_trial=2, cpus_per_trial=2)).search_id == first.search_id


def test_mlflow_environment_variables_are_the_defaults_and_flags_win(tmp_path, monkeypatch):
    default = prepare(options(tmp_path, name="plain"))
    assert default.tracking_uri == f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    assert default.experiment == EXPERIMENT and default.notes == ()
    with http_server({MLFLOW_API: 200}) as server:  # the tracking server must answer (plan.services)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
        monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team runs")
        from_env = prepare(options(tmp_path, name="env"))
    assert (from_env.tracking_uri, from_env.experiment) == (server, "team runs")
    assert from_env.notes == (  # said once when the search starts
        f"MLflow tracking URI {server} from $MLFLOW_TRACKING_URI (a flag overrides it)",
        "MLflow experiment team runs from $MLFLOW_EXPERIMENT_NAME (a flag overrides it)",
    )
    flags = prepare(options(tmp_path, name="flags", tracking_uri="sqlite:////tmp/x.db", experiment="mine"))
    assert (flags.tracking_uri, flags.experiment, flags.notes) == ("sqlite:////tmp/x.db", "mine", ())
    with pytest.raises(UserError, match="--experiment must name an MLflow experiment"):
        prepare(options(tmp_path, name="empty", experiment=" "))


def test_resume_keeps_the_recorded_store_and_experiment_whatever_the_environment(tmp_path, monkeypatch):
    first = started(tmp_path, experiment="mine")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team runs")
    resumed = prepare(options(tmp_path, resume=True))
    assert (resumed.tracking_uri, resumed.experiment) == (first.tracking_uri, "mine")


def test_resume_applies_max_failures_and_the_same_values(tmp_path):
    started(tmp_path, settings={"max_steps": 40}, max_failures=1)
    assert prepare(options(tmp_path, resume=True)).max_failures == 1
    again = prepare(options(tmp_path, resume=True, max_failures=5, num_samples=3, settings={"max_steps": 40}))
    assert again.max_failures == 5


def test_an_unreadable_search_record_is_a_user_error(tmp_path):
    started(tmp_path)
    (tmp_path / "results" / "s" / storage.SEARCH_FILE).write_text("{truncated")
    with pytest.raises(UserError, match="search record .* is unreadable"):
        prepare(options(tmp_path, resume=True))


def key(**kw):
    base = dict(
        weights=None,
        pretrained=True,
        dataset="imagefolder",
        reference="fractals",
        reference_split="test",
        data_dir=None,
        variant="paper",
        max_pairs=None,
    )
    return cache.cache_key(PlasticityInputs("vit_testbed_patch8_32.fractal", **{**base, **kw}))


def test_the_plasticity_cache_key_names_the_data_and_the_code(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder / "train" / "cat").mkdir(parents=True)
        (tmp_path / folder / "train" / "cat" / "0.png").write_bytes(b"one")
    a, b = key(data_dir=tmp_path / "a"), key(data_dir=tmp_path / "b")
    assert a != b and a["data_dir"] == str(tmp_path / "a")
    assert key(data_dir=tmp_path / "a") == a
    (tmp_path / "a" / "train" / "cat" / "1.png").write_bytes(b"two")  # the images changed
    assert key(data_dir=tmp_path / "a")["images"] != a["images"]
    assert a["code"] == cache.code_version() and a["code"].startswith("0.1.0+")
    path = lambda k: cache.default_out_dir("m", "imagefolder", "fractals", "paper", k)
    assert path(a) != path(b)


def augment_options(tmp_path, defaults=None, parameters=None, **kw) -> SearchOptions:
    space = tmp_path / "augment.yaml"
    space.write_text(space_text(defaults=defaults or {}, parameters=parameters or {}))
    return SearchOptions(space=str(space), storage=str(tmp_path / "results"), plasticity=False, **kw)


def test_the_augmentation_is_the_datasets_unless_the_space_or_a_flag_names_one(tmp_path):
    from vitplast_tune.config import trial_config
    from vitplast_tune.records.search_run import augmentation_text

    default = prepare(augment_options(tmp_path, name="a"))
    assert default.settings.augment == "light"  # digits' default, resolved before anything starts
    assert trial_config({"lr": 0.1}, default.settings).augment == "light"
    space = prepare(augment_options(tmp_path, defaults={"augment": "none"}, name="b"))
    assert trial_config({"lr": 0.1}, space.settings).augment == "none"
    flag = prepare(augment_options(tmp_path, defaults={"augment": "none"}, name="c", settings={"augment": "paper"}))
    assert (
        trial_config({"lr": 0.1}, flag.settings).augment == "paper"
        and augmentation_text(flag.spec, flag.settings) == "augmentation paper"
    )
    searched = prepare(augment_options(tmp_path, parameters={"augment": {"choice": ["none", "paper"]}}, name="d"))
    assert trial_config({"augment": "paper"}, searched.settings).augment == "paper"
    assert augmentation_text(searched.spec, searched.settings) == "augmentation searched: none, paper"
    with pytest.raises(UserError, match='unknown augmentation "papr" \\(did you mean "paper"\\?\\)'):
        prepare(augment_options(tmp_path, parameters={"augment": {"choice": ["none", "papr"]}}, name="e"))


def test_a_resumed_search_keeps_its_recorded_augmentation(tmp_path):
    first = started(tmp_path, settings={"augment": "none"})
    assert first.settings.augment == "none"
    assert prepare(options(tmp_path, resume=True)).settings.augment == "none"
    with pytest.raises(UserError, match="augment='paper' differs from the 'none'"):
        prepare(options(tmp_path, resume=True, settings={"augment": "paper"}))
    record = tmp_path / "results" / "s" / storage.SEARCH_FILE  # recorded before the setting existed: the paper's
    saved = json.loads(record.read_text())
    del saved["settings"]["augment"]
    record.write_text(json.dumps(saved))
    assert prepare(options(tmp_path, resume=True)).settings.augment == "paper"


def test_budgets_come_from_the_flag_are_recorded_and_exclude_max_steps(tmp_path):
    space = tmp_path / "lab.yaml"
    space.write_text(space_text(budgets=[8, {"steps": 16, "lr": [0.05]}]))
    base = dict(space=str(space), storage=str(tmp_path / "results"), plasticity=False, name="lab")
    first = prepare(SearchOptions(**base, budgets=(6, 12)))
    assert first.spec.budget_steps == (6, 12) and first.spec.budgets[1].narrowed["lr"].values == (0.05,)
    write_record(first.local_dir, first.record("run-id"))
    resumed = prepare(SearchOptions(**base, resume=True))
    assert resumed.spec.budget_steps == (6, 12)  # the recorded budgets, not the file's
    with flags_spoken(), pytest.raises(UserError, match=r"--budgets \[6, 24\] differs from the \[6, 12\]"):
        prepare(SearchOptions(**base, resume=True, budgets=(6, 24)))
    with pytest.raises(UserError, match="give --budgets, not --max-steps"):
        prepare(SearchOptions(**{**base, "name": "other"}, settings={"max_steps": 40}))


def test_more_than_one_gpu_per_trial_is_one_worker_per_whole_gpu(tmp_path):
    with pytest.raises(
        UserError, match=r"--gpus-per-trial 2.5 with 2 worker\(s\): each data-parallel worker trains on"
    ):
        prepare(options(tmp_path, gpus_per_trial=2.5))


def test_relative_weights_and_data_paths_are_resolved_before_trials(tmp_path, monkeypatch):
    from vitplast_tune.config import TESTBED_WEIGHTS

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "w.safetensors").write_bytes(TESTBED_WEIGHTS.read_bytes())
    (tmp_path / "data" / "CIFAR-10-C").mkdir(parents=True)  # a dataset read from data_dir: CIFAR-10-C's two files
    np.save(tmp_path / "data" / "CIFAR-10-C" / "snow.npy", np.zeros((50, 32, 32, 3), dtype=np.uint8))
    np.save(tmp_path / "data" / "CIFAR-10-C" / "labels.npy", np.tile(np.arange(10), 5).astype(np.uint8))
    monkeypatch.chdir(tmp_path)
    settings = {"weights": "models/w.safetensors", "data_dir": "data", "model": "vit_testbed_patch8_32"}
    settings["dataset"] = "cifar10c:snow"
    prepared = prepare(options(tmp_path, settings=settings))
    assert prepared.settings.weights == str(tmp_path / "models" / "w.safetensors")
    assert prepared.settings.data_dir == str(tmp_path / "data")
    monkeypatch.chdir(tmp_path / "data")  # what a trial's working directory does to a relative path
    assert Path(prepared.settings.weights).is_file()


def test_a_setting_the_space_searches_and_a_warmup_as_long_as_the_budget_are_said(tmp_path):
    plan = prepare(options(tmp_path, settings={"components": "mha", "max_steps": 20, "warmup_steps": 40}))
    assert (
        "components given on the command line is searched by space.yaml: each trial samples its own, the value given "
        "is unused"
    ) in plan.notes
    assert (
        "warm-up of 40 steps with max_steps 20: the learning rate rises for the whole budget and never reaches lr; set "
        "warmup_steps (or warmup_fraction) below max_steps"
    ) in plan.notes  # passed without a word before
    assert not any("warm-up" in n for n in prepare(options(tmp_path, name="short", settings={"max_steps": 41})).notes)


def test_the_cluster_a_search_joins_is_resolved_once_in_its_plan(monkeypatch):
    from vitplast_tune.plan.search_plan import Running

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert Running.of(SearchOptions()).joining == "10.0.0.1:6379"  # read once: the run joins what the plan says
    assert Running.of(SearchOptions(address="ray://head:10001")).joining == "ray://head:10001"  # the flag wins
    assert Running.of(SearchOptions(address="local")).joining is None  # a local Ray instance of its own
    monkeypatch.delenv("RAY_ADDRESS")
    assert Running.of(SearchOptions()).joining is None


def test_an_experiment_name_from_the_environment_longer_than_mlflow_takes_is_refused_naming_it(tmp_path, monkeypatch):
    from vitplast_tune.plan.planner import mlflow_target

    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "e" * 501)
    with pytest.raises(
        UserError, match=r"^\$MLFLOW_EXPERIMENT_NAME is 501 characters long; MLflow takes .* at most 500"
    ):
        mlflow_target(SearchOptions(), str(tmp_path))
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "e" * 500)
    assert mlflow_target(SearchOptions(), str(tmp_path))[1] == "e" * 500
