"""A lab's kept records made from its folder (lab/records.py), on a planted stage: every trial with its scored
checkpoint's metrics (the best validation accuracy's step, not the last), every evaluation as a curve point, the
per-image test correctness, a diverged trial kept and marked."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from vitplast_tune.lab import records


def plant_stage(directory):
    """A finished stage of two trials: ``a`` best at step 10 (its last evaluation is worse), ``b`` diverged at 20."""
    directory.mkdir(parents=True)
    common = {"lr": 0.1, "method": "full", "trainable_params": 1000, "plasticity_mean": 1.5, "auto_rgn": 0.2}
    pd.DataFrame(
        [
            {"trial_id": "t_00000", "components": "mha+fc1", "seed": 0, "best_val_acc": 0.8, "test_acc": 0.75,
             "step": 20, "diverged": False, "over_budget": False, "error": None, "time_in_steps_s": 3.0,
             "images_per_s": 100.0, **common},
            {"trial_id": "t_00001", "components": "ln1", "seed": 42, "best_val_acc": None, "test_acc": None,
             "step": 20, "diverged": True, "over_budget": False, "error": None, "time_in_steps_s": None,
             "images_per_s": None, **common},
        ]
    ).to_csv(directory / "trials.csv", index=False)  # fmt: skip
    reports = {
        "train_trial_t_00000_0": [
            {"trial_id": "t_00000", "step": 10, "val_acc": 0.8, "val_loss": 0.5, "best_step": 10, "time_total_s": 2.0},
            {"trial_id": "t_00000", "step": 20, "val_acc": 0.7, "val_loss": 0.9, "best_step": 10, "time_total_s": 4.0,
             "test_acc": 0.75, "test_loss": 0.6, "test_correct": "1101"},
        ],
        "train_trial_t_00001_1": [
            {"trial_id": "t_00001", "step": 10, "val_acc": 0.5, "val_loss": 1.5, "best_step": 10, "time_total_s": 2.5},
            {"trial_id": "t_00001", "step": 20, "val_acc": math.nan, "diverged": 1, "time_total_s": 3.0},
        ],
    }  # fmt: skip
    for name, lines in reports.items():
        (directory / name).mkdir()
        (directory / name / "result.json").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_kept_records_hold_every_trial_every_evaluation_and_each_test_image(tmp_path):
    plant_stage(tmp_path / "lab.s0.digits" / "full")
    (tmp_path / "lab.s0.digits" / "lab.json").write_text('{"lab": "lab.s0.digits"}\n')
    out = records.write_kept(tmp_path / "lab.s0.digits", tmp_path / "kept", pd.Series({"mha+fc1": 0.3}))
    trials = pd.read_csv(out / "trials.csv", dtype={"trial_id": str})
    assert list(trials.columns) == list(records.TRIAL_COLUMNS)
    a, b = (trials.set_index("trial_id").loc[t] for t in ("t_00000", "t_00001"))
    assert (a["stage"], a["subset"], a["status"], a["steps"], a["best_step"]) == ("full", "mha+fc1", "ok", 20, 10)
    assert (a["val_acc"], a["val_loss"], a["test_acc"], a["test_loss"]) == (0.8, 0.5, 0.75, 0.6)  # at step 10
    assert a["in_network_mean"] == 0.3 and a["contains_mha_or_fc"] == 1.0 and a["seconds"] == 4.0
    assert a["log_trainable_params"] == pytest.approx(3.0) and a["plasticity_mean"] == 1.5  # log10(1000)
    assert b["status"] == "diverged" and pd.isna(b["test_acc"]) and b["contains_mha_or_fc"] == 0.0
    curves = pd.read_csv(out / "curves.csv", dtype={"trial_id": str})
    assert curves.values.tolist() == [
        ["t_00000", 10, 2.0, 0.8, 0.5], ["t_00000", 20, 4.0, 0.7, 0.9], ["t_00001", 10, 2.5, 0.5, 1.5],
    ]  # fmt: skip
    correct = pd.read_csv(out / "test_correct.csv", dtype=str)
    assert correct.values.tolist() == [["t_00000", "1101"]]
    assert json.loads((out / "lab.json").read_text()) == {"lab": "lab.s0.digits"}
    assert not list(out.glob("*.tmp"))
