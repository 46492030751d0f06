"""A finished lab read back from its kept folder alone (``docs/results/data/...``): its record, every trial, and
where the folder has them each trial's per-image test outcomes and learning curve.

Two layouts are read. The kept records of the pre-registered labs (``lab.json``, ``trials.csv``, ``curves.csv``,
``test_correct.csv``; docs/results/data/README.md) and the first kept labs of 2026-12-02 (``lab.json``,
``analysis/lab_trials.csv``, ``analysis/criteria_subsets.csv``: final values only). What a folder lacks is said in
``LabRecords.notes``, and the analysis says it again in its output.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from vitplast_tune.errors import UserError
from vitplast_tune.lab.records import CURVES, TEST_CORRECT, TRIALS
from vitplast_tune.lab.tasks import LAB_FILE

FIRST_TRIALS, FIRST_SUBSETS = Path("analysis") / "lab_trials.csv", Path("analysis") / "criteria_subsets.csv"


@dataclass
class LabRecords:
    """A kept lab as the analysis reads it.

    Attributes:
        name: The lab's folder name.
        model: Its model (timm name).
        task: Its task.
        dataset: Its dataset.
        trials: Every trial: components, lr, seed, the selection metric, test_acc, every predictor.
        select: The selection metric's column (best validation accuracy).
        correct: Per-image test outcomes (trials x images), None when not kept.
        curves: The learning curves, None when not kept.
        extra: Per-subset predictors not in the trials (the first kept labs' in-network plasticity).
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
        """Whether the lab's record says its task qualified (a record without a qualification: yes)."""
        return bool(self.record.get("qualification", {}).get("qualifies", True))

    @property
    def minutes(self) -> float:
        """The wall minutes of the lab's stages as recorded (NaN without stages)."""
        stages = self.record.get("stages", {})
        return sum(float(s.get("seconds", 0.0)) for s in stages.values()) / 60 if stages else math.nan

    @property
    def seeds(self) -> int:
        """The number of distinct seeds among the trials."""
        return int(self.trials["seed"].nunique())


def read_kept(folder: str | Path) -> LabRecords:
    """A lab from its kept folder, in either layout.

    Args:
        folder: the lab's folder (``lab.<model>.<task>``).

    Returns:
        Its records, with ``notes`` saying what the folder does not keep.

    Raises:
        UserError: the folder has no ``lab.json`` or no trial table.
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
    """The 0/1 outcomes per test image of each trial in ``trial_ids``' order; UserError when one is missing or the
    strings differ in length."""
    table = pd.read_csv(path, dtype={"trial_id": str, "correct": str}).set_index("trial_id")["correct"]
    missing = [t for t in trial_ids if t not in table.index]
    if missing:
        raise UserError(f"{path}: no outcomes for trial(s) {', '.join(missing[:3])}")
    strings = [table[t] for t in trial_ids]
    if len({len(s) for s in strings}) > 1:
        raise UserError(f"{path}: the outcome strings differ in length (one test set per lab)")
    return np.array([np.frombuffer(s.encode(), dtype=np.uint8) - ord("0") for s in strings], dtype=np.uint8)
