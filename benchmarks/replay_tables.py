"""The criteria lab's kept records as replay tables: subset x lr x seed -> learning curve and recorded time.

A table is one kept folder (``docs/results/data/lab-v2/lab.<model>.<task>/``, or a check under ``checks/``, or an
older lab's ``analysis/lab_trials.csv`` with final values only). Each configuration (subset, lr) holds one run per
seed: its validation curve (step, val_acc at every evaluation), its test accuracy and its seconds per training step
(``time_in_steps_s / steps``: what a step costs on the GPU, a frozen component's missing backward pass included).
The search's answer for a configuration is judged by its TEST accuracy averaged over the table's seeds, so one lucky
seed does not count.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from benchmarks import common

DATA = common.ROOT / "docs" / "results" / "data"
Key = tuple[str, float]


@dataclass(frozen=True)
class Run:
    """One trial of a table: its seed, its curve ((step, val_acc) per evaluation), its test accuracy and the
    recorded seconds of one training step."""

    seed: int
    curve: tuple[tuple[int, float], ...]
    test_acc: float
    seconds_per_step: float
    diverged: bool = False

    @property
    def seconds(self) -> float:
        """The recorded training seconds of the whole run."""
        return self.curve[-1][0] * self.seconds_per_step


@dataclass
class Table:
    """One kept folder as a replay table."""

    name: str
    path: Path
    runs: dict[Key, list[Run]]
    final_only: bool  # no curves: one evaluation per run, so no scheduler can stop early
    lab: dict = field(default_factory=dict)  # lab.json (model, dataset, space, seeds)
    digest: str = ""  # SHA-256 of the files read: a cached replay is reused only for the same table

    @property
    def subsets(self) -> list[str]:
        """The subsets in the order the lab trained them (Tune's grid order)."""
        return list(dict.fromkeys(s for s, _ in self.runs))

    def rates(self, subset: str) -> list[float]:
        """The subset's recorded learning rates, ascending."""
        return sorted(lr for s, lr in self.runs if s == subset)

    @property
    def max_steps(self) -> int:
        return max(run.curve[-1][0] for runs in self.runs.values() for run in runs)

    def mean_test(self, key: Key) -> float:
        """The configuration's test accuracy averaged over its seeds (a run without one counts 0)."""
        values = [0.0 if math.isnan(r.test_acc) else r.test_acc for r in self.runs[key]]
        return sum(values) / len(values)

    @property
    def best(self) -> tuple[Key, float]:
        """The configuration with the highest mean test accuracy, and that accuracy."""
        key = max(self.runs, key=self.mean_test)
        return key, self.mean_test(key)

    @property
    def grid_seconds(self) -> float:
        """The grid's cost: every configuration trained once, at its mean recorded seconds over seeds."""
        return sum(sum(r.seconds for r in runs) / len(runs) for runs in self.runs.values())

    @property
    def grid_steps(self) -> int:
        return sum(round(sum(r.curve[-1][0] for r in runs) / len(runs)) for runs in self.runs.values())


def discover(root: Path = DATA) -> list[Path]:
    """Every replayable kept folder of lab-v2: each finished lab, and each check whose task has no finished lab yet
    (a finished lab holds its check's trials again with the rest), sorted by name."""
    whole = {
        Path(p).name: Path(p) for p in glob.glob(str(root / "lab-v2" / "lab.*")) if Path(p, "trials.csv").is_file()
    }
    checks = {
        Path(p).name: Path(p)
        for p in glob.glob(str(root / "lab-v2" / "checks" / "lab.*"))
        if Path(p, "trials.csv").is_file()
    }
    return [({**checks, **whole})[name] for name in sorted({**checks, **whole})]


def load_table(folder: str | Path) -> Table:
    """A kept folder as a table: ``trials.csv`` with ``curves.csv`` (lab-v2), or ``analysis/lab_trials.csv`` (an older
    lab: final values only).

    Args:
        folder: the kept folder.

    Returns:
        The table; trials not trained (over budget, errors) are left out.

    Raises:
        FileNotFoundError: the folder holds neither kind of record.
    """
    folder = Path(folder)
    lab = json.loads((folder / "lab.json").read_text()) if (folder / "lab.json").is_file() else {}
    files = [folder / "trials.csv", folder / "curves.csv"]
    if not files[0].is_file():
        files = [folder / "analysis" / "lab_trials.csv"]
    if not files[0].is_file():
        raise FileNotFoundError(f"{folder}: no trials.csv nor analysis/lab_trials.csv")
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files if f.is_file())).hexdigest()[:16]
    trials = pd.read_csv(files[0], dtype={"trial_id": str})
    if "subset" in trials:
        runs, final_only = _v2_runs(trials, pd.read_csv(files[1], dtype={"trial_id": str})), False
    else:
        runs, final_only = _final_runs(trials), True
    return Table(folder.name, folder, runs, final_only, lab, digest)


def _v2_runs(trials: pd.DataFrame, curves: pd.DataFrame) -> dict[Key, list[Run]]:
    """lab-v2's trials with their curves."""
    by_trial = {t: g.sort_values("step") for t, g in curves.groupby("trial_id")}
    runs: dict[Key, list[Run]] = {}
    for row in trials.itertuples():
        diverged = row.status == "diverged"
        if not (row.status == "ok" and row.trial_id in by_trial or diverged):
            continue
        points = by_trial.get(row.trial_id, curves.iloc[:0])
        curve = tuple((int(s), float(a)) for s, a in zip(points["step"], points["val_acc"].fillna(0.0)))
        if diverged and not (curve and curve[-1][0] >= row.steps):
            # curves.csv keeps finite evaluations only: the report of the step it diverged at (NaN metrics, as Tune
            # saw it) ends the curve, so that its steps are charged and a run diverged before its first evaluation
            # still costs its steps and counts in its configuration's mean test accuracy.
            curve += ((int(row.steps), math.nan),)
        per_step = _per_step(row.time_in_steps_s, row.steps, points, getattr(row, "seconds", math.nan))
        run = Run(int(row.seed), curve, float(row.test_acc), per_step, diverged)
        runs.setdefault((str(row.subset), float(row.lr)), []).append(run)
    return runs


def _final_runs(trials: pd.DataFrame) -> dict[Key, list[Run]]:
    """An older lab's trials: one evaluation each (its best validation accuracy at its last step)."""
    runs: dict[Key, list[Run]] = {}
    for row in trials.itertuples():
        if getattr(row, "over_budget", False) is True or not (row.step > 0):
            continue
        curve = ((int(row.step), float(row.best_val_acc) if row.best_val_acc == row.best_val_acc else 0.0),)
        run = Run(int(row.seed), curve, float(row.test_acc), float(row.time_in_steps_s) / int(row.step))
        runs.setdefault((str(row.components), float(row.lr)), []).append(run)
    return runs


def _per_step(time_in_steps_s: float, steps: int, points: pd.DataFrame, seconds: float) -> float:
    """Seconds per training step: ``time_in_steps_s / steps``, else the wall seconds of the curve's last evaluation
    (or of the trial's last report: a diverged run reports no timings) per step."""
    if time_in_steps_s == time_in_steps_s and steps:
        return float(time_in_steps_s) / int(steps)
    if len(points):
        return float(points["seconds"].iloc[-1]) / int(points["step"].iloc[-1])
    return float(seconds) / int(steps)
