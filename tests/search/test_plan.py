"""Validation before anything starts: metric and mode, the scheduler's budget, weights files, resume state."""

from pathlib import Path

import pytest
import torch
from _spaces import space_text

from vitplast_tune import storage
from vitplast_tune.errors import UserError
from vitplast_tune.predictors import report
from vitplast_tune.search import plan
from vitplast_tune.search.plan import SearchOptions
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
        plan.prepare(options(tmp_path, metric, mode))


def test_a_grace_period_above_the_budget_is_clamped_and_said_once(tmp_path):
    prepared = plan.prepare(options(tmp_path, settings={"max_steps": 40}))
    assert prepared.spec.scheduler.grace_period == 40 and prepared.spec.scheduler.name == "asha"
    assert prepared.notes == [
        "scheduler grace_period 100 is above max_steps 40: using 40, so no trial is stopped early"
    ]
    assert plan.prepare(options(tmp_path, name="other")).notes == []  # 400 steps: the space's 100 stands


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


def started(tmp_path, **kw) -> plan.SearchPlan:
    """A search that was started (its record written) with ``kw``."""
    first = plan.prepare(options(tmp_path, **kw))
    plan.write_record(first, "parent-run")
    return first


def test_resume_keeps_the_recorded_settings_and_identity(tmp_path):
    first = started(tmp_path, settings={"max_steps": 40}, seed=3, max_concurrent=2)
    resumed = plan.prepare(options(tmp_path, resume=True))
    assert resumed.settings == first.settings and resumed.settings.max_steps == 40
    assert (resumed.seed, resumed.max_concurrent, resumed.search_id) == (3, 2, first.search_id)
    assert resumed.spec.scheduler.grace_period == 40  # the recorded budget, not the space's 400
    assert len(first.search_id) == 32 and plan.prepare(options(tmp_path, name="new")).search_id != first.search_id


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(settings={"max_steps": 80}), "--max-steps 80 differs from the 40"),
        (dict(settings={"model": "vit_tiny_patch16_224"}), "--model vit_tiny_patch16_224 differs"),
        (dict(settings={"dataset": "fractals"}), "--dataset fractals differs"),
        (dict(num_samples=9), "--num-samples 9 differs from the 3"),
        (dict(max_concurrent=1), "--max-concurrent 1 differs from the None"),
        (dict(seed=4), "--seed 4 differs from the 0"),
        (dict(tracking_uri="sqlite:////tmp/elsewhere.db"), "--tracking-uri sqlite:////tmp/elsewhere.db differs"),
    ],
)
def test_resume_refuses_a_change_that_would_make_the_search_inconsistent(tmp_path, change, message):
    started(tmp_path, settings={"max_steps": 40})
    with pytest.raises(UserError, match=message):
        plan.prepare(options(tmp_path, resume=True, **change))


def test_resume_applies_max_failures_and_the_same_values(tmp_path):
    started(tmp_path, settings={"max_steps": 40}, max_failures=1)
    assert plan.prepare(options(tmp_path, resume=True)).max_failures == 1
    again = plan.prepare(options(tmp_path, resume=True, max_failures=5, num_samples=3, settings={"max_steps": 40}))
    assert again.max_failures == 5


def test_an_unreadable_search_record_is_a_user_error(tmp_path):
    started(tmp_path)
    (tmp_path / "results" / "s" / storage.SEARCH_FILE).write_text("{truncated")
    with pytest.raises(UserError, match="search record .* is unreadable"):
        plan.prepare(options(tmp_path, resume=True))


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
    return report.cache_key("vit_testbed_patch8_32.fractal", **{**base, **kw})


def test_the_plasticity_cache_key_names_the_data_and_the_code(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder / "train" / "cat").mkdir(parents=True)
        (tmp_path / folder / "train" / "cat" / "0.png").write_bytes(b"one")
    a, b = key(data_dir=tmp_path / "a"), key(data_dir=tmp_path / "b")
    assert a != b and a["data_dir"] == str(tmp_path / "a")
    assert key(data_dir=tmp_path / "a") == a
    (tmp_path / "a" / "train" / "cat" / "1.png").write_bytes(b"two")  # the images changed
    assert key(data_dir=tmp_path / "a")["images"] != a["images"]
    assert a["code"] == report.code_version() and a["code"].startswith("0.1.0+")
    path = lambda k: report.default_out_dir("m", "imagefolder", "fractals", "paper", k)
    assert path(a) != path(b)


def test_more_than_one_gpu_per_trial_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"--gpus-per-trial 2: a trial trains on one GPU .* a fraction such as 0.5"):
        plan.prepare(options(tmp_path, gpus_per_trial=2))


def test_relative_weights_and_data_paths_are_resolved_before_trials(tmp_path, monkeypatch):
    from vitplast_tune.config import TESTBED_WEIGHTS

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "w.safetensors").write_bytes(TESTBED_WEIGHTS.read_bytes())
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    settings = {"weights": "models/w.safetensors", "data_dir": "data", "model": "vit_testbed_patch8_32"}
    prepared = plan.prepare(options(tmp_path, settings=settings))
    assert prepared.settings.weights == str(tmp_path / "models" / "w.safetensors")
    assert prepared.settings.data_dir == str(tmp_path / "data")
    monkeypatch.chdir(tmp_path / "data")  # what a trial's working directory does to a relative path
    assert Path(prepared.settings.weights).is_file()
