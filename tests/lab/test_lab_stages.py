"""The lab's driver (workflows/lab.py) and its stages (lab/): a task's lab as stage searches, extended beyond the
grid where a best rate is at its end (a planted edge optimum here), the qualification check on validation data,
resuming, and one real extension end to end with its kept records (curves, per-image test correctness)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from vitplast_tune.errors import UserError
from vitplast_tune.lab import qualify, records, tasks
from vitplast_tune.lab import stages as lab_stages
from vitplast_tune.workflows import lab as driver

GRID = (0.1, 0.3, 1.0)


def fake_trials(components, lrs, best=None, level=None, spread=0.005):
    """Trials of ``components`` at ``lrs`` x 3 seeds: each best at ``best[c]`` (default 0.3), accuracy ``level[c]``."""
    best, level = best or {}, level or {}
    rows = []
    for c in components:
        for lr in lrs:
            for i, seed in enumerate((0, 42, 3407)):
                acc = level.get(c, 0.8) - 0.05 * abs(np.log10(lr / best.get(c, 0.3))) + spread * (i - 1)
                rows.append({"components": c, "lr": lr, "seed": seed, "best_val_acc": acc, "test_acc": acc})
    return pd.DataFrame(rows)


@pytest.fixture
def stages(monkeypatch):
    """``driver.run_stage`` replaced by planted trials: fc1 truly best at lr 1.5 (between the grid's top and the next
    rung), ln1 at 0.01 (two rungs below the grid), the others at 0.3; every call recorded."""
    calls = []

    def run(lab, stage, components, lrs=None):
        calls.append((stage, list(components), lrs))
        levels = {"all": 0.9, "mha": 0.85, "ln1": 0.6}
        return fake_trials(components, lrs or GRID, best={"fc1": 1.5, "ln1": 0.01}, level=levels)

    monkeypatch.setattr(driver, "run_stage", run)
    return calls


def test_a_planted_edge_optimum_gets_the_rates_beyond_it_round_by_round(stages, tmp_path):
    lab = tasks.Lab("digits_c-contrast", storage=tmp_path, max_rounds=2)
    trials = driver.bracketed_stage(lab, "single", ["ln1", "mha", "fc1"])
    assert stages == [
        ("single", ["ln1", "mha", "fc1"], None),
        ("single.ext1.lr0.03", ["ln1"], [0.03]),
        ("single.ext1.lr3", ["fc1"], [3.0]),
        ("single.ext2.lr0.01", ["ln1"], [0.01]),  # 0.03 beat 0.1: ln1 still at the low end, one more rung
    ]
    assert set(trials.loc[trials["components"] == "fc1", "lr"]) == {0.1, 0.3, 1.0, 3.0}
    table = qualify.at_best_rate(trials, ["ln1", "mha", "fc1"])
    assert table.loc["fc1", "position"] == "interior" and table.loc["fc1", "lr"] == 1.0  # 3 was worse: bracketed
    assert table.loc["ln1", "position"] == "low edge" and table.loc["ln1", "lr"] == 0.01  # two rounds used up: marked
    assert table.loc["mha", "position"] == "interior" and table.loc["mha", "lr"] == 0.3


def test_the_check_stops_at_a_saturated_task_and_measures_the_spread_in_seed_sds(stages, tmp_path, monkeypatch):
    found = driver.qualify(tasks.Lab("fractals_novel", storage=tmp_path, max_rounds=1))
    assert [c[0] for c in stages][:2] == ["full", "single"]
    assert found.full["mean"] == pytest.approx(0.9) and found.best == "mha" and found.worst == "ln1"
    assert found.seed_sd == pytest.approx(0.005) and found.in_sds > 3 and found.qualifies
    record = tasks.read_lab_record(tmp_path / "lab.s0.fractals_novel")
    assert record["qualification"]["qualifies"] is True and record["qualification"]["best"] == "mha"
    text = qualify.describe_qualifications([found])
    assert "fractals_novel" in text and "1 of 1 qualify" in text

    def saturated(lab, stage, components, lrs=None):
        stages.append((stage, list(components), lrs))
        return fake_trials(components, lrs or GRID, level={"all": 0.97})

    monkeypatch.setattr(driver, "run_stage", saturated)
    stages.clear()
    found = driver.qualify(tasks.Lab("digits", storage=tmp_path))
    assert [c[0] for c in stages] == ["full"] and not found.qualifies and found.reason.startswith("saturated")
    assert "not trained (saturated)" in qualify.describe_qualifications([found])


def test_the_check_reads_validation_accuracy_never_the_tests(monkeypatch, tmp_path):
    """Planted trials whose test accuracy says the opposite of their validation accuracy: full finetuning saturated
    on test (0.97) but not on validation (0.90), single components far apart on test but within 3 seed SDs on
    validation. The check follows validation both times, and the record says what it read."""

    def planted(lab, stage, components, lrs=None):
        frame = fake_trials(components, lrs or GRID, level={"all": 0.9, "mha": 0.801, "ln1": 0.8})
        test = {"all": 0.97, "mha": 0.95, "ln1": 0.6}
        return frame.assign(test_acc=[test.get(c, 0.8) for c in frame["components"]])

    monkeypatch.setattr(driver, "run_stage", planted)
    found = driver.qualify(tasks.Lab("fractals_novel", storage=tmp_path, max_rounds=0))
    assert found.full["mean"] == pytest.approx(0.9) and not found.reason.startswith("saturated")
    assert found.best == "mha" and found.spread < 3 * found.seed_sd and not found.qualifies
    record = tasks.read_lab_record(tmp_path / "lab.s0.fractals_novel")["qualification"]
    assert record["read_on"] == "validation" and record["qualifies"] is False
    assert record["max_full_val_acc"] == 0.95 and record["min_single_component_seed_sds"] == 3.0


def test_a_stage_space_narrows_the_lab_space_and_bad_spaces_or_names_are_refused(tmp_path):
    lab = tasks.Lab("digits", storage=tmp_path)
    path = lab_stages.stage_space(lab, "single.ext1.lr3", ["fc1", "ln1"], [3.0])
    raw = yaml.safe_load(path.read_text())
    assert raw["parameters"]["components"] == {"choice": ["fc1", "ln1"]} and raw["parameters"]["lr"] == {
        "choice": [3.0]
    }
    assert raw["criteria"] is False and raw["parameters"]["seed"] == {"choice": [0, 42, 3407]}
    assert raw["defaults"]["max_steps"] == 150
    mtime = path.stat().st_mtime_ns
    assert (
        lab_stages.stage_space(lab, "single.ext1.lr3", ["fc1", "ln1"], [3.0]).stat().st_mtime_ns == mtime
    )  # unchanged
    tpe = tmp_path / "tpe.yaml"
    tpe.write_text("metric: val_acc\nmode: max\nalgorithm: optuna\nnum_samples: 2\nparameters: {lr: 0.1}\n")
    with pytest.raises(UserError, match="a lab needs algorithm: grid"):
        lab_stages.base_space(str(tpe))
    with pytest.raises(UserError, match='unknown task "digit"'):
        tasks.Lab("digit", storage=tmp_path)
    with pytest.raises(UserError, match='unknown model "s2"'):
        tasks.Lab("digits", "s2", storage=tmp_path)


@pytest.mark.slow
def test_a_real_extension_search_runs_and_a_second_run_resumes_nothing(ray_local, tiny_space, tmp_path):
    """The linear probe at rates far too small to move its predictions in 20 steps: every rate ties, so the first
    (lowest) is the best and lies at the grid's low end, and the lab trains it at the next rate below (one geometric
    step, 5e-6) in a search of its own; the same call again reads both searches' trial tables and trains nothing.
    The kept records hold every trial, both evaluations of each (steps 10 and 20) and, per trial, one 0/1 per test
    image whose mean is its test accuracy."""
    space = tiny_space(
        "probe_lab",
        algorithm="grid",
        scheduler="fifo",
        num_samples=1,
        parameters={
            "components": {"choice": ["head"]},
            "lr": {"choice": [1e-5, 2e-5, 4e-5]},
            "seed": {"choice": [0, 1, 2]},
            "optimizer": "sgd",
        },
        defaults={"max_steps": 20, "eval_every": 10},
    )
    lab = tasks.Lab("digits", storage=tmp_path / "labs", space=str(space), max_rounds=1, verbose=0)
    trials = driver.bracketed_stage(lab, "single", ["head"])
    assert sorted(trials["lr"].unique()) == pytest.approx([5e-6, 1e-5, 2e-5, 4e-5]) and len(trials) == 12
    record = tasks.read_lab_record(lab.dir)
    assert set(record["stages"]) == {"single", "single.ext1.lr5e-06"}
    assert record["stages"]["single.ext1.lr5e-06"]["trials"] == 3 and record["stages"]["single"]["seconds"] > 0
    again = driver.bracketed_stage(lab, "single", ["head"])
    assert len(again) == 12 and tasks.read_lab_record(lab.dir)["stages"] == record["stages"]
    kept = records.write_kept(lab.dir, tmp_path / "kept")
    table = pd.read_csv(kept / "trials.csv", dtype={"trial_id": str})
    assert len(table) == 12 and set(table["status"]) == {"ok"} and set(table["stage"]) == set(record["stages"])
    assert set(table["seed"]) == {0, 1, 2} and table["steps"].eq(20).all() and table["test_loss"].gt(0).all()
    assert table["val_acc"].tolist() == pytest.approx(
        trials.set_index("trial_id").loc[table["trial_id"], "best_val_acc"].tolist()
    )
    assert table["log_trainable_params"].gt(0).all() and table["seconds"].gt(0).all()
    curves = pd.read_csv(kept / "curves.csv", dtype={"trial_id": str})
    assert len(curves) == 24 and curves.groupby("trial_id")["step"].apply(tuple).map((10, 20).__eq__).all()
    assert curves.groupby("trial_id")["seconds"].is_monotonic_increasing.all() and curves["val_loss"].gt(0).all()
    correct = pd.read_csv(kept / "test_correct.csv", dtype={"trial_id": str, "correct": str}).set_index("trial_id")
    assert len(correct) == 12 and correct["correct"].str.len().eq(359).all()  # digits: 20% of 1797 images
    share = correct["correct"].map(lambda bits: bits.count("1") / len(bits))
    assert share.tolist() == pytest.approx(table.set_index("trial_id").loc[correct.index, "test_acc"].tolist())
    assert (kept / "lab.json").is_file()


def test_a_lab_is_refused_before_ray_without_a_folder_when_it_cannot_run_or_differs_from_its_record(tmp_path, capsys):
    """CPUs per trial of 0 and a space that is no lab grid: one line, no Ray session, no lab folder made. A lab
    resumed with another space (or other seeds) than its record names: one line naming the difference."""
    from _commands import refused

    from vitplast_tune.space.files import load_space, spaces_dir

    storage = tmp_path / "labs"
    lab_dir = storage / "lab.s0.digits"
    line = refused("lab", ["run", "digits", "--storage", str(storage), "--cpus-per-trial", "0"], tmp_path, capsys)
    assert "--cpus-per-trial must be positive, got 0" in line and not lab_dir.exists()
    line = refused(
        "lab",
        ["check", "--task", "digits", "--storage", str(storage), "--space", "component_subsets"],
        tmp_path,
        capsys,
    )
    assert "a lab needs algorithm: grid" in line and not lab_dir.exists()

    other = tmp_path / "other_lab.yaml"  # the lab space with another grid of rates
    raw = yaml.safe_load((spaces_dir() / "criteria_lab.yaml").read_text())
    raw["parameters"]["lr"] = {"choice": [0.01, 0.02, 0.04]}
    other.write_text(yaml.safe_dump(raw))
    lab = tasks.Lab("digits", storage=storage)
    tasks.record_stage(lab, "full", ["all"], None, seconds=1.0, trials=9)
    assert tasks.read_lab_record(lab_dir)["space_fingerprint"] == load_space("criteria_lab").fingerprint
    line = refused("lab", ["run", "digits", "--storage", str(storage), "--space", str(other)], tmp_path, capsys)
    assert "lab.s0.digits" in line and "was started with --space criteria_lab (lab.json), not " + str(other) in line
    lab_stages.check_lab(lab)  # as it started: goes on

    record = tasks.read_lab_record(lab_dir)
    tasks.write_lab_record(lab_dir, {**record, "seeds": [1, 2, 3]})  # a registered run's seeds
    with pytest.raises(UserError, match=r"started with seeds \[1, 2, 3\] \(lab.json\), not None"):
        lab_stages.check_lab(lab)


def test_a_lab_whose_first_stage_started_with_other_rates_is_refused_before_ray(tmp_path, capsys):
    """A lab interrupted in its first stage (no lab.json yet), run again with a space of other rates: one line naming
    the stage, before Ray, and the stage's space file is not rewritten; as it started, it goes on."""
    from _commands import refused

    from vitplast_tune.space.files import spaces_dir
    from vitplast_tune.storage import SEARCH_FILE

    storage = tmp_path / "labs"
    lab = tasks.Lab("digits", storage=storage)
    started = lab_stages.stage_space(lab, "full", ["all"])  # what run_stage writes before its search starts
    (lab.dir / "full").mkdir(parents=True)
    (lab.dir / "full" / SEARCH_FILE).write_text("{}")  # the stage's search started, and was interrupted
    text = started.read_text()
    other = tmp_path / "other_lab.yaml"
    raw = yaml.safe_load((spaces_dir() / "criteria_lab.yaml").read_text())
    raw["parameters"]["lr"] = {"choice": [0.01, 0.02, 0.04]}
    other.write_text(yaml.safe_dump(raw))
    line = refused("lab", ["run", "digits", "--storage", str(storage), "--space", str(other)], tmp_path, capsys)
    assert f"lab.s0.digits in {storage}: its stage full was started with another space than --space {other}" in line
    assert started.read_text() == text and not (lab.dir / "lab.json").exists()
    lab_stages.check_lab(lab)  # as it started: goes on
