"""Compare trials with the most accurate one in GPU time, for the cost-aware objectives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from vitplast_tune.analysis.prediction import finished_trials
from vitplast_tune.records.pareto import pareto_front
from vitplast_tune.space.objectives import PER_GPU_HOUR, TRAINING_SECONDS


@dataclass(frozen=True)
class CostPoint:
    """A trial against the most accurate one: ``gap`` points below it, at ``share`` of its training seconds."""

    components: str
    lr: float | None
    accuracy: float
    seconds: float
    gap: float
    share: float

    def sentence(self) -> str:
        """Put the comparison in words: "fc1 at 0.3: 0.4 points below the best at 38% of its GPU-seconds"."""
        what = self.components if self.lr is None else f"{self.components} at {self.lr:.3g}"
        if self.gap <= 0:
            return f"{what}: the most accurate ({100 * self.accuracy:.2f}%, {self.seconds:.1f} GPU-seconds)"
        return f"{what}: {self.gap:.1f} points below the best at {self.share:.0%} of its GPU-seconds"


def cost_points(trials: pd.DataFrame, objective: str) -> list[CostPoint]:
    """Compare the trials the objective names with the most accurate full-budget trial.

    ``pareto`` names the front of accuracy and training seconds, ``accuracy_per_gpu_hour`` the trial with the most
    accuracy per GPU-hour, and any other objective none.
    """
    if trials.empty or TRAINING_SECONDS not in trials or objective not in ("pareto", "accuracy_per_gpu_hour"):
        return []
    done = finished_trials(trials).dropna(subset=["best_val_acc", TRAINING_SECONDS])
    if done.empty:
        return []
    best = done.sort_values("best_val_acc", ascending=False, kind="stable").iloc[0]
    if objective == "pareto":
        chosen = pareto_front(done, TRAINING_SECONDS, "min")
    else:
        rated = done.dropna(subset=[PER_GPU_HOUR]) if PER_GPU_HOUR in done else done.head(0)
        chosen = rated.sort_values(PER_GPU_HOUR, ascending=False, kind="stable").head(1)
    return [_point(row, best) for row in chosen.to_dict("records")]


def cost_lines(trials: pd.DataFrame, objective: str) -> list[str]:
    """Write the answer's lines on cost; none for the ``accuracy`` objective."""
    points = cost_points(trials, objective)
    if not points:
        return []
    if objective == "accuracy_per_gpu_hour":
        return [f"  Most accuracy per GPU-hour: {points[0].sentence()}."]
    said = "; ".join(p.sentence() for p in points)
    return [f"  Pareto front of accuracy and training GPU-seconds ({len(points)} trials, cheapest first): {said}."]


def _point(row: dict[str, Any], best: pd.Series) -> CostPoint:
    lr = row.get("lr")
    seconds, best_seconds = float(row[TRAINING_SECONDS]), float(best[TRAINING_SECONDS])
    return CostPoint(
        str(row["components"]),
        None if lr is None or pd.isna(lr) else float(lr),
        float(row["best_val_acc"]),
        seconds,
        100 * (float(best["best_val_acc"]) - float(row["best_val_acc"])),
        seconds / best_seconds if best_seconds > 0 else float("nan"),
    )
