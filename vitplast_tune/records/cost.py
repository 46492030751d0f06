"""What an answer costs in GPU time, for the cost-aware objectives (``--objective accuracy_per_gpu_hour`` and
``pareto``): each trial worth naming against the most accurate one, in points of validation accuracy and in its share
of that trial's training seconds (each trial's own ``time_in_steps_s``), worded from the numbers."""

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
        """The comparison in words, e.g. "fc1+fc2 at 0.3: 0.4 points below the best at 38% of its GPU-seconds"."""
        what = self.components if self.lr is None else f"{self.components} at {self.lr:.3g}"
        if self.gap <= 0:
            return f"{what}: the most accurate ({100 * self.accuracy:.2f}%, {self.seconds:.1f} GPU-seconds)"
        return f"{what}: {self.gap:.1f} points below the best at {self.share:.0%} of its GPU-seconds"


def cost_points(trials: pd.DataFrame, objective: str) -> list[CostPoint]:
    """The trials the objective names, each against the most accurate full-budget trial.

    Args:
        trials: the search's trial table.
        objective: ``pareto`` (the front of best validation accuracy and training seconds, most accurate last) or
            ``accuracy_per_gpu_hour`` (the trial with the most accuracy per GPU-hour); any other: none.

    Returns:
        The points; empty when no full-budget trial reported its training seconds.
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
    """The answer's lines on cost for a cost-aware objective (none for ``accuracy``)."""
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
