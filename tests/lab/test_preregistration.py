"""The pre-registration file: the committed one reads whole (every key of the contract, the design the runner follows:
models, candidate tasks, seeds, thresholds) and a broken copy of it is refused with the one line that says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vitplast_tune.errors import UserError
from vitplast_tune.lab.preregistration import KEYS, read_preregistration
from vitplast_tune.lab.tasks import MODELS, TASKS
from vitplast_tune.predictors.scores import lab_criteria

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "data" / "lab-v2" / "preregistration.yaml"


def test_the_committed_preregistration_names_the_design_the_runner_follows():
    found = read_preregistration(COMMITTED)
    assert found.models == ("s0", "s1") and found.raw["models"] == MODELS
    assert len(found.candidate_tasks) == 12 and set(found.candidate_tasks) <= set(TASKS)
    assert found.candidate_tasks[0] == "digits_c-contrast" and found.amends is None
    assert found.tasks_per_model == 4 and found.seeds == (0, 42, 3407, 1, 2) and found.raw["seeds"] == 5
    assert (found.max_full_val_acc, found.min_spread_sds) == (0.95, 3.0) and found.extension_rounds == 2
    assert found.space == "criteria_lab" and tuple(found.raw["predictors"]) == lab_criteria()
    assert found.raw["baseline"] == "log_trainable_params" and found.raw["baseline"] in found.raw["predictors"]
    claims = [(f["claim"], f["predictor"]) for f in found.raw["family"]]
    judged = [p for p in lab_criteria() if p != found.raw["baseline"]]
    assert claims == [("better", p) for p in judged] + [("equivalent", p) for p in judged] + [
        ("narrower", "plasticity_mean")
    ]
    assert len(found.sha256) == 64


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda raw: raw.pop("margin"), "missing key(s) margin"),
        (lambda raw: raw["candidate_tasks"].append("digit"), "candidate_tasks must be distinct known tasks"),
        (lambda raw: raw["candidate_tasks"].append("digits"), "candidate_tasks must be distinct known tasks"),
        (lambda raw: raw.update(seeds=3), "seeds (3) must count the distinct seed_values"),
        (lambda raw: raw["models"].update(s1="vit_testbed_patch8_32"), "model s1: vit_testbed_patch8_32 is not one"),
        (lambda raw: raw["qualification"].pop("max_full_val_acc"), "qualification needs max_full_val_acc"),
        (lambda raw: raw.update(tasks_per_model=0), "tasks_per_model must be between 1 and 12"),
        (lambda raw: raw.update(extension_rounds=-1), "extension_rounds must be a whole number >= 0"),
    ],
)
def test_a_broken_preregistration_is_refused_with_its_reason(tmp_path, change, message):
    raw = yaml.safe_load(COMMITTED.read_text())
    change(raw)
    path = tmp_path / "pre.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_preregistration(path)


AMENDMENT = COMMITTED.with_name("amendment-1.yaml")
AMENDMENT_2 = COMMITTED.with_name("amendment-2.yaml")


@pytest.mark.parametrize("path", [AMENDMENT, AMENDMENT_2])
def test_a_committed_amendment_adds_tasks_after_the_files_own_and_nothing_else(path):
    base, amended = read_preregistration(COMMITTED), read_preregistration(path)
    assert amended.amends == base and amended.sha256 != base.sha256 and amended.path == path
    assert amended.candidate_tasks[:12] == base.candidate_tasks
    same = ("models", "tasks_per_model", "max_full_val_acc", "min_spread_sds", "seeds", "space", "extension_rounds")
    assert all(getattr(amended, k) == getattr(base, k) for k in same)
    assert {k: v for k, v in amended.raw.items() if k != "amendment"} == base.raw


def test_amendment_2_keeps_amendment_1s_order_and_adds_the_four_new_corruptions_on_both_sets():
    first, second = read_preregistration(AMENDMENT), read_preregistration(AMENDMENT_2)
    assert second.candidate_tasks[: len(first.candidate_tasks)] == first.candidate_tasks
    added = second.candidate_tasks[len(first.candidate_tasks) :]
    new = ("fog", "glass_blur", "zoom_blur", "gaussian_blur")
    assert added == tuple(f"{s}_c-{c}" for c in new for s in ("digits", "fractals_novel"))
    assert set(second.candidate_tasks) == set(TASKS)  # every task the lab knows is a candidate now


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda raw: raw.update(amends_sha256="0" * 64), "preregistration.yaml is not the file it amends"),
        (lambda raw: raw.update(margin=0.2), "an amendment adds candidate tasks only, not margin"),
        (lambda raw: raw["candidate_tasks_added"].append("digits"), "already there: ['digits']"),
        (lambda raw: raw["candidate_tasks_added"].append("digits_c-frost"), "unknown: ['digits_c-frost']"),
        (lambda raw: raw.pop("reason"), "missing key(s) reason"),
    ],
)
def test_a_broken_amendment_is_refused_with_its_reason(tmp_path, change, message):
    raw = yaml.safe_load(AMENDMENT.read_text())
    change(raw)
    (tmp_path / "preregistration.yaml").write_bytes(COMMITTED.read_bytes())
    path = tmp_path / "amendment.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        read_preregistration(path)


def test_every_contract_key_is_required():
    assert set(KEYS) <= set(yaml.safe_load(COMMITTED.read_text()))
    with pytest.raises(UserError, match="not found"):
        read_preregistration(COMMITTED.with_name("nope.yaml"))
