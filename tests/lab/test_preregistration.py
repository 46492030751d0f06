"""The pre-registration file: the committed one reads whole (every key of the contract, the design the runner follows:
models, candidate tasks, seeds, thresholds) and a broken copy of it is refused with the one line that says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vitplast_tune.errors import UserError
from vitplast_tune.lab.preregistration import KEYS, read_preregistration
from vitplast_tune.lab.tasks import MODELS, TASKS
from vitplast_tune.predictors.scores import LAB_PREDICTORS as PREDICTORS

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "data" / "lab-v2" / "preregistration.yaml"


def test_the_committed_preregistration_names_the_design_the_runner_follows():
    found = read_preregistration(COMMITTED)
    assert found.models == ("s0", "s1") and found.raw["models"] == MODELS
    assert set(found.candidate_tasks) == set(TASKS) and found.candidate_tasks[0] == "digits_c-contrast"
    assert found.tasks_per_model == 4 and found.seeds == (0, 42, 3407, 1, 2) and found.raw["seeds"] == 5
    assert (found.max_full_val_acc, found.min_spread_sds) == (0.95, 3.0) and found.extension_rounds == 2
    assert found.space == "criteria_lab" and tuple(found.raw["predictors"]) == PREDICTORS
    assert found.raw["baseline"] == "log_trainable_params" and found.raw["baseline"] in found.raw["predictors"]
    claims = [(f["claim"], f["predictor"]) for f in found.raw["family"]]
    judged = [p for p in PREDICTORS if p != found.raw["baseline"]]
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


def test_every_contract_key_is_required():
    assert set(KEYS) <= set(yaml.safe_load(COMMITTED.read_text()))
    with pytest.raises(UserError, match="not found"):
        read_preregistration(COMMITTED.with_name("nope.yaml"))
