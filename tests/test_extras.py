"""What the base install leaves to an extra is named when a search needs it: a LoRA trial without peft (the ``lora``
extra) and an ``hf:`` model without transformers (the ``hf`` extra) are refused with one line naming the extra, before
Ray starts. Each extra is hidden here as an interpreter without it sees it (``sys.modules[name] = None``); CI runs the
base install for real in a fresh environment (.ci/run)."""

from __future__ import annotations

import sys

import pytest
from _commands import refused
from _spaces import space_text

from vitplast_tune.errors import UserError


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A folder for a search whose work would fail the test: only its plan may run."""
    from vitplast_tune.plan import resources
    from vitplast_tune.run import driver

    def work(*args, **kwargs):
        raise AssertionError("the search started: its input was not refused")

    monkeypatch.setattr(driver, "execute", work)
    monkeypatch.setattr(resources, "ray_running_here", lambda: False)  # a fresh command-line process
    return tmp_path


def test_a_lora_trial_without_peft_is_refused_naming_the_extra(world, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    (world / "space.yaml").write_text(space_text(parameters={"components": {"choice": ["fc1", "mha:lora+fc2"]}}))
    line = refused("search", ["--space", str(world / "space.yaml"), "--storage", str(world / "results")], world, capsys)
    assert (
        line
        == 'error: mha:lora+fc2: LoRA needs peft, in the lora extra: pip install "vitplast_tune[lora]" (-e ".[lora]")'
    )
    assert not (world / "results" / "mlflow.db").exists()


def test_a_search_without_lora_needs_no_peft(world, monkeypatch):
    """The same space without LoRA plans without peft (the check asks only where a trial trains by LoRA)."""
    from vitplast_tune.plan import SearchOptions, planner

    monkeypatch.setitem(sys.modules, "peft", None)
    (world / "space.yaml").write_text(space_text(parameters={"components": {"choice": ["fc1", "mha+fc2"]}}))
    plan = planner.prepare(SearchOptions(space=str(world / "space.yaml"), storage=str(world / "results")))
    assert plan.spec.num_samples == 1


def test_inject_lora_without_peft_names_the_extra(monkeypatch):
    from vitplast_tune.vit import methods

    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(UserError, match=r'^LoRA needs peft, in the lora extra: pip install "vitplast_tune\[lora\]"'):
        methods.inject_lora(None, ["blocks.0.mlp.fc1"], rank=4, alpha=8.0)


def test_an_hf_model_without_transformers_is_refused_naming_the_extra(world, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    (world / "space.yaml").write_text(space_text())
    args = ["--space", str(world / "space.yaml"), "--storage", str(world / "results"), "--model", "hf:google/vit-x"]
    line = refused("search", args, world, capsys)
    assert "hf: models need transformers" in line and '".[hf]"' in line
