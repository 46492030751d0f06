"""Find a search's Pareto fronts of accuracy against a cost, and write them as tables, CSV and plots."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from vitplast_tune.analysis.prediction import finished_trials
from vitplast_tune.records.table import display_table
from vitplast_tune.storage import replaced

# What each Pareto front trades accuracy against: (column, "min" when less is better, label).
PARETO_AXES: tuple[tuple[str, str, str], ...] = (
    ("trainable_params", "min", "fewer trainable parameters"),
    ("images_per_s", "max", "more training images/s"),
)


def pareto_front(trials: pd.DataFrame, cost: str, better: str = "min") -> pd.DataFrame:
    """Find the full-budget trials that no other full-budget trial beats on both best validation accuracy and cost.

    Args:
        trials: The trial table.
        cost: The cost column.
        better: "min" when a lower cost is better, "max" when a higher one is.

    Returns:
        The front, sorted from the cheapest; ties keep the first. Empty when a column is missing.
    """
    accuracy = "best_val_acc"
    if trials.empty or cost not in trials or accuracy not in trials:
        return trials.head(0)
    done = finished_trials(trials).dropna(subset=[cost, accuracy])
    ordered = done.sort_values([cost, accuracy], ascending=[better == "min", False], kind="stable")
    best_before = ordered[accuracy].cummax().shift(fill_value=-float("inf"))
    return ordered[ordered[accuracy] > best_before]


def write_pareto(trials: pd.DataFrame, out: Path) -> list[Path]:
    """Write each Pareto front as CSV and PNG (``pareto_<cost>.csv``, ``.png``) in the folder ``out``."""
    from vitplast_tune.analysis.plots import plot_pareto

    files: list[Path] = []
    for cost, better, _ in PARETO_AXES:
        front = pareto_front(trials, cost, better)
        if front.empty:
            continue
        out.mkdir(parents=True, exist_ok=True)
        with replaced(out / f"pareto_{cost}.csv") as partial:
            front.to_csv(partial, index=False)
        files += [out / f"pareto_{cost}.csv", plot_pareto(trials, front, cost, out / f"pareto_{cost}.png")]
    return files


def describe_pareto(trials: pd.DataFrame) -> str:
    """Describe the Pareto fronts as the blocks printed under the top table.

    Args:
        trials: The trial table.

    Returns:
        Per cost axis, the trials no other full-budget trial beats on both; empty when there are none.
    """
    lines: list[str] = []
    for cost, better, label in PARETO_AXES:
        front = pareto_front(trials, cost, better)
        if front.empty:
            continue
        table = display_table(front).drop(columns=["val_acc", "steps"])
        if cost == "images_per_s":
            table["images/s"] = front["images_per_s"].map(lambda v: f"{v:,.0f}")
        lines += [
            f"Pareto front, best validation accuracy vs {label} ({len(front)} of the full-budget trials; "
            "no other one is better on both):",
            table.to_string(index=False),
            "",
        ]
    return "\n".join(lines).rstrip()
