"""Check on validation data whether a task is worth a lab: not saturated, and its single components apart."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from vitplast_tune.analysis import bracket
from vitplast_tune.analysis.protocol import best_lr_table
from vitplast_tune.components import BLOCK_COMPONENTS
from vitplast_tune.lab.tasks import FULL, Lab, read_lab_record, write_lab_record

SCORE = "best_val_acc"  # the check reads each trial's best validation accuracy, never the test set


@dataclass
class Qualification:
    """Hold a task's check on a model, read on validation accuracy.

    Attributes:
        lab: The lab's name.
        task: The task.
        model: The model's short name.
        full: Full finetuning at its best rate.
        singles: Each block component alone at its best rate.
        saturated: The saturation threshold it was judged by.
        spread_sds: The spread threshold it was judged by, in seed standard deviations.
        best: The single component with the highest mean.
        worst: The one with the lowest.
        spread: Their difference.
        seed_sd: Their pooled seed standard deviation, sqrt((sd_best^2 + sd_worst^2) / 2).
        qualifies: Whether the task qualifies.
        reason: The decision in words.
    """

    lab: str
    task: str
    model: str
    full: dict[str, Any]
    singles: pd.DataFrame
    saturated: float = math.nan
    spread_sds: float = math.nan
    best: str = ""
    worst: str = ""
    spread: float = math.nan
    seed_sd: float = math.nan
    qualifies: bool = False
    reason: str = ""

    @property
    def in_sds(self) -> float:
        """Return the spread in seed standard deviations."""
        return self.spread / self.seed_sd if self.seed_sd > 0 else math.inf if self.spread > 0 else math.nan


def at_best_rate(trials: pd.DataFrame, components: list[str], value: str = SCORE) -> pd.DataFrame:
    """Tabulate ``value`` for each of ``components`` at its best rate by mean validation accuracy over seeds."""
    table = best_lr_table(trials, value, select_by=SCORE).set_index("components")
    positions = bracket.bracket_table(trials).set_index("components")["position"]
    table = table.reindex([c for c in components if c in table.index])
    return table.assign(position=positions.reindex(table.index))[["lr", "mean", "std", "n_seeds", "position"]]


def judge_full(lab: Lab, full_trials: pd.DataFrame) -> Qualification:
    """Judge whether full finetuning saturates the task, and set ``reason`` if it does."""
    full = at_best_rate(full_trials, list(FULL)).iloc[0].to_dict()
    found = Qualification(lab.name, lab.task, lab.model, full, pd.DataFrame(), lab.saturated, lab.spread_sds)
    if full["mean"] >= lab.saturated:
        found.reason = f"saturated: full finetuning reaches {100 * full['mean']:.2f}% >= {100 * lab.saturated:g}%"
    return found


def judge_singles(found: Qualification, single_trials: pd.DataFrame) -> Qualification:
    """Judge whether the single block components lie far enough apart in seed standard deviations."""
    singles = at_best_rate(single_trials, list(BLOCK_COMPONENTS))
    found.singles = singles
    best, worst = singles["mean"].idxmax(), singles["mean"].idxmin()
    found.best, found.worst = best, worst
    found.spread = float(singles.loc[best, "mean"] - singles.loc[worst, "mean"])
    found.seed_sd = float(np.sqrt((singles.loc[best, "std"] ** 2 + singles.loc[worst, "std"] ** 2) / 2))
    found.qualifies = bool(found.in_sds >= found.spread_sds)
    found.reason = "qualifies" if found.qualifies else f"single components within {found.spread_sds:g} seed SDs"
    return found


def record_qualification(lab: Lab, found: Qualification) -> Qualification:
    """Write the check with its thresholds into the lab's record and return it."""
    record = read_lab_record(lab.dir)
    number = (int, float, np.floating, np.integer)
    record["qualification"] = {
        "read_on": "validation",
        "full": {k: (float(v) if isinstance(v, number) else v) for k, v in found.full.items()},
        "max_full_val_acc": found.saturated,
        "min_single_component_seed_sds": found.spread_sds,
        "best": found.best,
        "worst": found.worst,
        "spread": found.spread,
        "seed_sd": found.seed_sd,
        "in_sds": found.in_sds if found.best else None,
        "qualifies": found.qualifies,
        "reason": found.reason,
    }
    write_lab_record(lab.dir, record)
    return found


def describe_qualifications(found: list[Qualification]) -> str:
    """Describe every task's check as a table, and which tasks qualify.

    Args:
        found: The checks.

    Returns:
        The text.
    """
    rows = []
    for q in found:
        f = q.full
        spread = (
            f"{q.best} {100 * q.singles.loc[q.best, 'mean']:.2f}% - {q.worst} {100 * q.singles.loc[q.worst, 'mean']:.2f}%"
            f" = {100 * q.spread:.2f} pts, seed sd {100 * q.seed_sd:.2f}"
            if q.best
            else "not trained (saturated)"
        )
        rows.append(
            {
                "task": q.task,
                "model": q.model,
                "full finetuning val acc": f"{100 * f['mean']:.2f} ± {100 * f['std']:.2f}% (lr {f['lr']:g}, {f['position']})",
                "best - worst single component": spread,
                "SDs": "" if not q.best else f"{q.in_sds:.1f}",
                "verdict": q.reason,
            }
        )
    first = found[0] if found else Qualification("", "", "", {}, pd.DataFrame(), math.nan, math.nan)
    head = (
        f"Does each task qualify for the lab? On validation data: full finetuning below {100 * first.saturated:g}% "
        f"accuracy and the best and worst single block components at least {first.spread_sds:g} seed standard "
        "deviations apart (each at its best rate, mean ± std over seeds):"
    )
    with pd.option_context("display.width", 250, "display.max_colwidth", 80):
        table = pd.DataFrame(rows).to_string(index=False)
    qualified = [q.task + f" ({q.model})" for q in found if q.qualifies]
    return f"{head}\n{table}\n  -> {len(qualified)} of {len(found)} qualify: {', '.join(qualified) or 'none'}"
