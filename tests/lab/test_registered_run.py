"""Test the pre-registered labs (workflows/preregistered_labs.py) with planted stage searches.

The checks go in the file's order until ``tasks_per_model`` qualify per model, and the labs interleave by model with
the file's seeds. A resume trains nothing twice. A second start, a resume of nothing and a resume with an edited file
are refused.
"""

from __future__ import annotations

import contextlib
import json
import shutil

import pandas as pd
import pytest
import yaml
from test_lab_stages import GRID, fake_trials
from test_preregistration import COMMITTED

from vitplast_tune.errors import UserError
from vitplast_tune.lab.preregistration import read_preregistration
from vitplast_tune.lab.tasks import read_lab_record, record_stage
from vitplast_tune.workflows import lab as driver
from vitplast_tune.workflows import preregistered_labs

CANDIDATES = ["digits_c-contrast", "digits_c-snow", "fractals_novel", "fractals_novel_c-gaussian_noise"]
QUALIFYING = {"s0": {"digits_c-contrast", "fractals_novel", "fractals_novel_c-gaussian_noise"}, "s1": set(CANDIDATES)}


@pytest.fixture
def prereg(tmp_path):
    raw = yaml.safe_load(COMMITTED.read_text())
    raw.update(candidate_tasks=CANDIDATES, tasks_per_model=2)
    path = tmp_path / "pre.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture
def planted(monkeypatch):
    """Stage searches that write their planted trial table (and read it when it exists, as a finished search is
    read): single components apart on the qualifying tasks, alike on the others; every search trained recorded."""
    trained = []

    def run(lab, stage, components, lrs=None):
        path = lab.dir / stage / "trials.csv"
        if path.is_file():
            return pd.read_csv(path)
        trained.append((lab.name, stage, lab.seeds))
        apart = lab.task in QUALIFYING[lab.model]
        frame = fake_trials(
            components, lrs or GRID, level={"all": 0.9, "mha": 0.85 if apart else 0.8, "ln1": 0.7 if apart else 0.8}
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(path, index=False)
        return frame

    def keep(lab, out):
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lab.dir / "lab.json", out / "lab.json")

    monkeypatch.setattr(driver, "run_stage", run)
    monkeypatch.setattr(driver, "keep", keep)
    monkeypatch.setattr(driver, "ray_session", contextlib.nullcontext)
    return trained


def test_checks_in_order_then_labs_interleaved_with_the_files_seeds(prereg, planted, tmp_path):
    settings = preregistered_labs.RunSettings(tmp_path / "labs", verbose=0)
    record = preregistered_labs.run_registered(read_preregistration(prereg), settings)
    main = [(lab, stage) for lab, stage, _ in planted if "." not in stage]
    assert main == [
        ("lab.s0.digits_c-contrast", "full"), ("lab.s0.digits_c-contrast", "single"),
        ("lab.s0.digits_c-snow", "full"), ("lab.s0.digits_c-snow", "single"),
        ("lab.s0.fractals_novel", "full"), ("lab.s0.fractals_novel", "single"),  # two qualify on s0: no more checks
        ("lab.s1.digits_c-contrast", "full"), ("lab.s1.digits_c-contrast", "single"),
        ("lab.s1.digits_c-snow", "full"), ("lab.s1.digits_c-snow", "single"),
        ("lab.s0.digits_c-contrast", "rest"), ("lab.s1.digits_c-contrast", "rest"),  # the first lab of each model
        ("lab.s0.fractals_novel", "rest"), ("lab.s1.digits_c-snow", "rest"),
    ]  # fmt: skip
    assert {seeds for _, _, seeds in planted} == {(0, 42, 3407, 1, 2)}
    events = [(e["event"], e.get("lab"), e.get("qualifies")) for e in record["events"]]
    assert events[0][0] == "started" and events[-1][0] == "finished"
    assert ("checked", "lab.s0.digits_c-snow", False) in events and (
        "lab finished",
        "lab.s1.digits_c-snow",
        None,
    ) in events
    stored = json.loads((tmp_path / "labs" / "registered.json").read_text())
    assert stored["sha256"] == read_preregistration(prereg).sha256 and stored["events"] == record["events"]
    lab = read_lab_record(tmp_path / "labs" / "kept" / "lab.s0.fractals_novel")
    assert lab["finished"] and lab["preregistration_sha256"] == stored["sha256"] and lab["seeds"] == [0, 42, 3407, 1, 2]
    assert lab["qualification"]["read_on"] == "validation"
    assert not (tmp_path / "labs" / "lab.s0.fractals_novel_c-gaussian_noise").exists()

    planted.clear()
    again = preregistered_labs.run_registered(read_preregistration(prereg), settings, resume=True)
    assert planted == [] and [e["event"] for e in again["events"]][-2:] == ["resumed", "finished"]


def test_a_second_start_a_resume_of_nothing_and_an_edited_file_are_refused(prereg, planted, tmp_path):
    settings = preregistered_labs.RunSettings(tmp_path / "labs", verbose=0)
    with pytest.raises(UserError, match="holds no registered run to continue"):
        preregistered_labs.start_or_resume(read_preregistration(prereg), settings, resume=True)
    preregistered_labs.start_or_resume(read_preregistration(prereg), settings, resume=False)
    with pytest.raises(UserError, match="holds a registered run already: --resume continues it"):
        preregistered_labs.start_or_resume(read_preregistration(prereg), settings, resume=False)
    prereg.write_text(prereg.read_text().replace("margin: 0.1", "margin: 0.2"))
    with pytest.raises(UserError, match="changed since the run .* started"):
        preregistered_labs.start_or_resume(read_preregistration(prereg), settings, resume=True)
    assert planted == []


def test_the_command_starts_a_run_once_and_resumes_it_with_resume(prereg, planted, tmp_path, capsys):
    from vitplast_tune.cli.lab import lab_main

    argv = ["registered", "--preregistration", str(prereg), "--storage", str(tmp_path / "labs"), "--quiet"]
    assert lab_main(argv) == 0 and len(planted) > 0
    events = [e["event"] for e in json.loads((tmp_path / "labs" / "registered.json").read_text())["events"]]
    assert events[0] == "started" and "resumed" not in events and events[-1] == "finished"
    assert "Registered run of pre.yaml" in capsys.readouterr().out
    planted.clear()
    assert lab_main([*argv, "--resume"]) == 0 and planted == []
    events = [e["event"] for e in json.loads((tmp_path / "labs" / "registered.json").read_text())["events"]]
    assert events[-2:] == ["resumed", "finished"] and events.count("started") == 1


REAL_KEEP = driver.keep


def test_a_run_restored_from_kept_checks_trains_only_the_labs_rest_and_keeps_the_checks_rows_first(
    prereg, planted, tmp_path, monkeypatch
):
    """Checks kept on an earlier machine (a committed ``checks/`` folder) are read, not trained again; a qualifying
    task's lab then trains its rest alone, and its kept tables are the check's rows, as kept, then the rest's."""
    planted_run = driver.run_stage

    def run(lab, stage, components, lrs=None):  # the planted stage, with trial ids as a real search has them
        frame = planted_run(lab, stage, components, lrs)
        if "trial_id" not in frame:
            frame.insert(0, "trial_id", [f"{lab.model}{stage}_{i:05d}" for i in range(len(frame))])
            frame["diverged"] = False  # a real trial table's columns
            frame.to_csv(lab.dir / stage / "trials.csv", index=False)
            record_stage(lab, stage, components, lrs, seconds=1.0, trials=len(frame))
        return frame

    monkeypatch.setattr(driver, "run_stage", run)
    monkeypatch.setattr(driver, "keep", REAL_KEEP)
    monkeypatch.setattr(driver, "in_network", lambda lab, subsets: pd.Series(1.5, index=list(subsets)))
    design = read_preregistration(prereg)
    earlier = preregistered_labs.RunSettings(tmp_path / "earlier", verbose=0)
    record = preregistered_labs.start_or_resume(design, earlier, resume=False)
    for model in design.models:
        preregistered_labs.check_model(design, earlier, record, model)  # the earlier machine checked, then was lost
    committed = tmp_path / "committed" / "checks"
    shutil.copytree(tmp_path / "earlier" / "kept", committed)
    planted.clear()

    settings = preregistered_labs.RunSettings(tmp_path / "labs", verbose=0, restore_from=committed.parent)
    record = preregistered_labs.run_registered(design, settings)
    assert {stage for _, stage, _ in planted} == {"rest"}  # no check trained again
    assert [e["lab"] for e in record["events"] if e["event"] == "restored"] == sorted(
        p.name for p in committed.iterdir()
    )
    lab = tmp_path / "labs" / "kept" / "lab.s0.fractals_novel"
    rows = pd.read_csv(lab / "trials.csv", dtype=str, keep_default_na=False)
    check_rows = (committed / "lab.s0.fractals_novel" / "trials.csv").read_text().splitlines()
    assert (lab / "trials.csv").read_text().splitlines()[: len(check_rows)] == check_rows
    assert list(rows["stage"].unique()) == ["full", "single", "rest"]
    kept = read_lab_record(lab)
    assert kept["finished"] and set(kept["stages"]) == {"full", "single", "rest"}
    assert kept["restored"]["copy"] == "restored/lab.s0.fractals_novel"

    planted.clear()  # a resume restores nothing twice and trains nothing
    again = preregistered_labs.run_registered(design, settings, resume=True)
    assert planted == [] and "restored" not in [e["event"] for e in again["events"][len(record["events"]) :]]


def test_kept_checks_of_other_seeds_are_refused_before_anything_is_written(prereg, planted, tmp_path, capsys):
    from vitplast_tune.cli.lab import lab_main

    folder = tmp_path / "committed" / "checks" / "lab.s0.digits_c-contrast"
    folder.mkdir(parents=True)
    record = {"model": "vit_testbed_patch8_32.fractal", "seeds": [0, 42, 3407], "space": "criteria_lab"}
    (folder / "lab.json").write_text(json.dumps({**record, "qualification": {"qualifies": True, "reason": "ok"}}))
    argv = ["registered", "--preregistration", str(prereg), "--storage", str(tmp_path / "labs")]
    with pytest.raises(UserError, match=r"its seeds is \[0, 42, 3407\], the pre-registration's \[0, 42, 3407, 1, 2\]"):
        lab_main([*argv, "--restore-from", str(tmp_path / "committed")])
    assert not (tmp_path / "labs").exists() and planted == []


def test_an_amendments_tasks_are_checked_after_the_files_own_for_a_model_still_short(prereg, planted, tmp_path):
    raw = yaml.safe_load(prereg.read_text())
    raw.update(candidate_tasks=["digits_c-contrast", "digits_c-snow"], tasks_per_model=2)
    prereg.write_text(yaml.safe_dump(raw, sort_keys=False))
    amendment = prereg.with_name("amendment.yaml")
    amendment.write_text(
        yaml.safe_dump(
            {
                "amends": prereg.name,
                "amends_sha256": read_preregistration(prereg).sha256,
                "registered": "2026-12-03",
                "reason": "s0 is short",
                "candidate_tasks_added": ["fractals_novel", "fractals_novel_c-gaussian_noise"],
            }
        )
    )
    settings = preregistered_labs.RunSettings(tmp_path / "labs", verbose=0)
    record = preregistered_labs.run_registered(read_preregistration(amendment), settings)
    checked = [e["lab"] for e in record["events"] if e["event"] == "checked"]
    assert checked == [  # s0 qualifies on digits_c-contrast alone of the file's: the amendment's first task next
        "lab.s0.digits_c-contrast", "lab.s0.digits_c-snow", "lab.s0.fractals_novel",
        "lab.s1.digits_c-contrast", "lab.s1.digits_c-snow",
    ]  # fmt: skip
    assert record["preregistration"] == "amendment.yaml" and {e["lab"] for e in record["events"] if "lab" in e} >= {
        "lab.s0.fractals_novel"
    }


def test_an_interrupted_registered_run_says_to_resume_it_with_resume(prereg, planted, tmp_path, monkeypatch):
    from vitplast_tune.cli.lab import lab_main
    from vitplast_tune.errors import SearchInterrupted

    def interrupted(*args, **kwargs):
        raise SearchInterrupted("interrupted: 5 trial(s) unfinished; nothing is lost", 130)

    monkeypatch.setattr(preregistered_labs, "run_registered", interrupted)
    argv = ["registered", "--preregistration", str(prereg), "--storage", str(tmp_path / "labs"), "--quiet"]
    with pytest.raises(SearchInterrupted, match="registered command with --resume continues the run"):
        lab_main(argv)
