"""Write a lab's kept records from its folder as its stages finish, and read a kept lab back from its folder alone.

docs/results/data/README.md describes the columns.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
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
    """Return the folders of a lab's finished stages, those with a trial table, in name order."""
    return sorted(d for d in Path(lab_dir).iterdir() if d.is_dir() and (d / "trials.csv").is_file())


def lab_trials(lab_dir: Path) -> pd.DataFrame:
    """Join every finished stage's trial table, with a ``stage`` column.

    Args:
        lab_dir: The lab's folder.

    Returns:
        The trials.

    Raises:
        UserError: If no stage has finished.
    """
    parts = [_stage_trials(d).assign(stage=d.name) for d in stage_dirs(lab_dir)]
    if not parts:
        raise UserError(f"lab {Path(lab_dir).name} has no finished stage yet: nothing to read")
    return pd.concat(parts, ignore_index=True)


def _trial_reports(stage_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Read each trial's reports in order from the ``result.json`` that Ray Tune keeps in its folder."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(stage_dir).glob("*/result.json")):
        for line in path.read_text().splitlines():
            if line.strip():
                report = json.loads(line)
                found.setdefault(str(report.get("trial_id", "")), []).append(report)
    return found


def kept_tables(lab_dir: Path, in_network: pd.Series | None = None) -> dict[str, pd.DataFrame]:
    """Build a lab's kept tables of trials, curves and per-image test outcomes, keyed by file name."""
    trials, curves, correct = [], [], []
    for stage in stage_dirs(lab_dir):
        table = _stage_trials(stage)
        reports = _trial_reports(stage)
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


def _stage_trials(stage_dir: Path) -> pd.DataFrame:
    """Read one stage's trial table, with ids as text."""
    from vitplast_tune.records.table import read_trials

    return read_trials(stage_dir)


def write_kept(lab_dir: Path, out: Path, in_network: pd.Series | None = None, *, earlier: Path | None = None) -> Path:
    """Write a lab's kept records and its ``lab.json`` into ``out``, each file whole, after any ``earlier`` ones.

    The ``earlier`` records are those of the lab's check kept on another machine.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, table in kept_tables(lab_dir, in_network).items():
        if earlier is not None:  # read as text so ids, digits and 0/1 strings come back as written
            table = pd.concat([pd.read_csv(Path(earlier) / name, dtype=str, keep_default_na=False), table])
        tmp = out / (name + ".tmp")
        table.to_csv(tmp, index=False)
        tmp.replace(out / name)
    if (Path(lab_dir) / LAB_FILE).is_file():  # lab.json goes last, so it says the tables beside it are whole
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
    """Build one kept trial's row from its best-validation checkpoint, with every predictor."""
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


# The first kept labs, of 2026-12-02, kept final values only, in these files.
FIRST_TRIALS, FIRST_SUBSETS = Path("analysis") / "lab_trials.csv", Path("analysis") / "criteria_subsets.csv"


@dataclass
class LabRecords:
    """Hold a kept lab as the analysis reads it.

    Attributes:
        name: The lab's folder name.
        model: Its model (timm name).
        task: Its task.
        dataset: Its dataset.
        trials: Every trial: components, lr, seed, the selection metric, test_acc, every predictor.
        select: The selection metric's column (best validation accuracy).
        correct: Per-image test outcomes (trials x images), None when not kept.
        curves: The learning curves, None when not kept.
        extra: Per-subset predictors not in the trials, such as the first kept labs' in-network plasticity.
        record: Its ``lab.json``.
        notes: What the folder does not keep.
    """

    name: str
    model: str
    task: str
    dataset: str
    trials: pd.DataFrame
    select: str
    correct: np.ndarray | None = None
    curves: pd.DataFrame | None = None
    extra: pd.DataFrame | None = None
    record: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def qualifies(self) -> bool:
        """Return whether the lab's record says its task qualified, taking a record without a check as yes."""
        return bool(self.record.get("qualification", {}).get("qualifies", True))

    @property
    def minutes(self) -> float:
        """Return the recorded wall minutes of the lab's stages, NaN without stages."""
        stages = self.record.get("stages", {})
        return sum(float(s.get("seconds", 0.0)) for s in stages.values()) / 60 if stages else math.nan

    @property
    def seeds(self) -> int:
        """Count the distinct seeds among the trials."""
        return int(self.trials["seed"].nunique())


def read_kept(folder: str | Path) -> LabRecords:
    """Read a lab from its kept folder, in the current layout or that of the first kept labs.

    Args:
        folder: The lab's folder, ``lab.<model>.<task>``.

    Returns:
        The lab's records, whose ``notes`` say what the folder does not keep.

    Raises:
        UserError: If the folder has no ``lab.json`` or no trial table.
    """
    folder = Path(folder)
    if not (folder / LAB_FILE).is_file():
        raise UserError(f"{folder} is not a kept lab: it has no {LAB_FILE}")
    record = json.loads((folder / LAB_FILE).read_text())
    where = (folder.name, str(record.get("model", "")), str(record.get("task", "")), str(record.get("dataset", "")))
    if (folder / TRIALS).is_file():
        return _read_current(folder, record, where)
    if (folder / FIRST_TRIALS).is_file():
        return _read_first(folder, record, where)
    raise UserError(f"{folder}: no {TRIALS} (nor the first labs' {FIRST_TRIALS}): nothing to analyse")


def _read_current(folder: Path, record: dict, where: tuple[str, str, str, str]) -> LabRecords:
    trials = pd.read_csv(folder / TRIALS, dtype={"trial_id": str})
    if "status" in trials:
        trials = trials[trials["status"].fillna("ok") == "ok"].reset_index(drop=True)
    trials = trials.rename(columns={"subset": "components"})
    notes = []
    correct = _outcomes(folder / TEST_CORRECT, trials["trial_id"]) if (folder / TEST_CORRECT).is_file() else None
    if correct is None:
        notes.append(f"no per-image test outcomes ({TEST_CORRECT}): test images are not resampled")
    curves = pd.read_csv(folder / CURVES, dtype={"trial_id": str}) if (folder / CURVES).is_file() else None
    if curves is None:
        notes.append(f"no learning curves ({CURVES})")
    return LabRecords(*where, trials, "val_acc", correct, curves, None, record, notes)


def _read_first(folder: Path, record: dict, where: tuple[str, str, str, str]) -> LabRecords:
    trials = pd.read_csv(folder / FIRST_TRIALS, dtype={"trial_id": str, "run_id": str})
    extra = None
    if (folder / FIRST_SUBSETS).is_file():
        subsets = pd.read_csv(folder / FIRST_SUBSETS)
        if "in_network_mean" in subsets:
            extra = subsets.set_index("components")[["in_network_mean"]]
    notes = [
        "kept as final values only (the first kept labs): no per-image test outcomes, so test images are not "
        "resampled; no learning curves"
    ]
    return LabRecords(*where, trials, "best_val_acc", None, None, extra, record, notes)


def _outcomes(path: Path, trial_ids: pd.Series) -> np.ndarray:
    """Read each trial's 0/1 outcome per test image, in ``trial_ids``' order."""
    table = pd.read_csv(path, dtype={"trial_id": str, "correct": str}).set_index("trial_id")["correct"]
    missing = [t for t in trial_ids if t not in table.index]
    if missing:
        raise UserError(f"{path}: no outcomes for trial(s) {', '.join(missing[:3])}")
    strings = [table[t] for t in trial_ids]
    if len({len(s) for s in strings}) > 1:
        raise UserError(f"{path}: the outcome strings differ in length (one test set per lab)")
    return np.array([np.frombuffer(s.encode(), dtype=np.uint8) - ord("0") for s in strings], dtype=np.uint8)
