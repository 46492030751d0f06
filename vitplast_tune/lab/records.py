"""A lab's kept records, made from its folder as its stages finish: ``trials.csv`` (one row per trial, its scored
checkpoint's metrics and every predictor), ``curves.csv`` (every evaluation of every trial) and ``test_correct.csv``
(0/1 per test image of each scored checkpoint, in the task's fixed test order), beside ``lab.json``. Read from each
stage's trial table and from the reports Ray Tune keeps in every trial's folder (``result.json``, one line per
report); docs/results/data/README.md describes the columns."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from vitplast_tune.errors import UserError
from vitplast_tune.lab.tasks import LAB_FILE
from vitplast_tune.predictors.scores import lab_criteria, structure_scores

TRIALS, CURVES, TEST_CORRECT = "trials.csv", "curves.csv", "test_correct.csv"
TRIAL_COLUMNS = (
    "trial_id", "stage", "subset", "method", "lr", "seed", "steps", "status", "val_acc", "val_loss", "test_acc",
    "test_loss", *lab_criteria(), "trainable_params", "best_step", "time_in_steps_s", "images_per_s", "seconds",
)  # fmt: skip
CURVE_COLUMNS = ("trial_id", "step", "seconds", "val_acc", "val_loss")


def stage_dirs(lab_dir: Path) -> list[Path]:
    """The finished stages of a lab (those with a trial table), in name order.

    Args:
        lab_dir: the lab's folder.

    Returns:
        Their folders.
    """
    return sorted(d for d in Path(lab_dir).iterdir() if d.is_dir() and (d / "trials.csv").is_file())


def lab_trials(lab_dir: Path) -> pd.DataFrame:
    """Every finished stage's trial table together, a ``stage`` column saying whose.

    Args:
        lab_dir: the lab's folder.

    Returns:
        The trials.

    Raises:
        UserError: no stage has finished.
    """
    parts = [lab_trials_of(d).assign(stage=d.name) for d in stage_dirs(lab_dir)]
    if not parts:
        raise UserError(f"lab {Path(lab_dir).name} has no finished stage yet: nothing to read")
    return pd.concat(parts, ignore_index=True)


def trial_reports(stage_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every report of every trial of a stage, from the ``result.json`` Ray Tune keeps in each trial's folder.

    Args:
        stage_dir: the stage's search folder.

    Returns:
        Trial id -> its reports in order (each the metrics it reported, with Ray's ``time_total_s``).
    """
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(stage_dir).glob("*/result.json")):
        for line in path.read_text().splitlines():
            if line.strip():
                report = json.loads(line)
                found.setdefault(str(report.get("trial_id", "")), []).append(report)
    return found


def kept_tables(lab_dir: Path, in_network: pd.Series | None = None) -> dict[str, pd.DataFrame]:
    """A lab's kept records as tables.

    Args:
        lab_dir: the lab's folder.
        in_network: each subset's in-network plasticity (``in_network_mean``; None: left empty).

    Returns:
        ``{"trials.csv": ..., "curves.csv": ..., "test_correct.csv": ...}``.
    """
    trials, curves, correct = [], [], []
    for stage in stage_dirs(lab_dir):
        table = lab_trials_of(stage)
        reports = trial_reports(stage)
        for row in table.to_dict("records"):
            tid = str(row["trial_id"])
            own = [r for r in reports.get(tid, []) if _finite(r.get("val_acc")) and "step" in r]
            curves += [{"trial_id": tid, **_curve_point(r)} for r in own]
            last = reports.get(tid, [{}])[-1]
            trials.append(_trial_row(stage.name, row, own, last, in_network))
            if last.get("test_correct"):
                correct.append({"trial_id": tid, "correct": str(last["test_correct"])})
    return {
        TRIALS: pd.DataFrame(trials, columns=list(TRIAL_COLUMNS)),
        CURVES: pd.DataFrame(curves, columns=list(CURVE_COLUMNS)),
        TEST_CORRECT: pd.DataFrame(correct, columns=["trial_id", "correct"]),
    }


def lab_trials_of(stage_dir: Path) -> pd.DataFrame:
    """One stage's trial table (ids as text)."""
    from vitplast_tune.records.table import read_trials

    return read_trials(stage_dir)


def write_kept(lab_dir: Path, out: Path, in_network: pd.Series | None = None, *, earlier: Path | None = None) -> Path:
    """Write a lab's kept records (``kept_tables``) and its ``lab.json`` into ``out``, each file whole.

    Args:
        lab_dir: the lab's folder.
        out: the folder to write (made when missing).
        in_network: each subset's in-network plasticity.
        earlier: kept records of the same lab's earlier stages (its check, kept on another machine), written first,
            their text unchanged.

    Returns:
        ``out``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, table in kept_tables(lab_dir, in_network).items():
        if earlier is not None:  # read as text: ids, digits and 0/1 strings come back as they were written
            table = pd.concat([pd.read_csv(Path(earlier) / name, dtype=str, keep_default_na=False), table])
        tmp = out / (name + ".tmp")
        table.to_csv(tmp, index=False)
        tmp.replace(out / name)
    if (Path(lab_dir) / LAB_FILE).is_file():  # last: a kept lab.json says the tables beside it are whole
        shutil.copyfile(Path(lab_dir) / LAB_FILE, out / (LAB_FILE + ".tmp"))
        (out / (LAB_FILE + ".tmp")).replace(out / LAB_FILE)
    return out


def _curve_point(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "step": int(report["step"]),
        "seconds": report.get("time_total_s"),
        "val_acc": report.get("val_acc"),
        "val_loss": report.get("val_loss"),
    }


def _trial_row(
    stage: str, row: dict[str, Any], curve: list[dict[str, Any]], last: dict[str, Any], in_network: pd.Series | None
) -> dict[str, Any]:
    """One kept trial: its scored checkpoint (the best validation accuracy's) and every predictor."""
    best_step = last.get("best_step")
    at_best = [r for r in curve if best_step is not None and int(r["step"]) == int(best_step)]
    subset = str(row["components"])
    status = "diverged" if _true(row.get("diverged")) else "over_budget" if _true(row.get("over_budget")) else "ok"
    if status == "ok" and isinstance(row.get("error"), str) and row["error"]:
        status = "error"
    return {
        "trial_id": str(row["trial_id"]),
        "stage": stage,
        "subset": subset,
        "method": row.get("method"),
        "lr": row.get("lr"),
        "seed": row.get("seed"),
        "steps": row.get("step"),
        "status": status,
        "val_acc": row.get("best_val_acc"),
        "val_loss": at_best[0].get("val_loss") if at_best else None,
        "test_acc": row.get("test_acc"),
        "test_loss": last.get("test_loss"),
        **{c: row.get(c) for c in lab_criteria()},
        "in_network_mean": None if in_network is None else in_network.get(subset),
        **structure_scores(subset, row.get("trainable_params")),
        "trainable_params": row.get("trainable_params"),
        "best_step": best_step,
        "time_in_steps_s": row.get("time_in_steps_s"),
        "images_per_s": row.get("images_per_s"),
        "seconds": last.get("time_total_s"),
    }


def _true(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1")
    return bool(value) and not (isinstance(value, float) and math.isnan(value))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
