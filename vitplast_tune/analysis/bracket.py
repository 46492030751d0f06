"""Is each configuration at its best learning rate? A configuration whose best mean validation accuracy (over seeds)
lies at an end of the rates it was trained at may do better beyond that end: ``bracket_table`` says where each
configuration's best rate lies and the next rate to try there, so a lab can train it (``labs.py``) or mark its row
and leave it out of the verdict.

Pure pandas: the trials of a grid with seeds (``components``, ``lr``, the selection metric), any depth or budget
apart (``keys``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from vitplast_tune.analysis.correlation import numeric, require_columns
from vitplast_tune.components import subset_name

LADDER = (1.0, 3.0)  # the half-decade rates of the shipped grids: ... 0.03, 0.1, 0.3, 1, 3 ...
INTERIOR, LOW, HIGH, SINGLE = "interior", "low edge", "high edge", "one rate"


def on_ladder(lr: float) -> bool:
    """Whether ``lr`` is 1 or 3 times a power of ten (to 1%)."""
    mantissa = lr / 10 ** math.floor(math.log10(lr))
    return any(abs(mantissa - m) < 0.01 * m for m in (*LADDER, 10.0))


def next_rate(lrs: list[float], side: str) -> float:
    """The rate beyond the ``side`` ("low" or "high") end of the rates ``lrs``: the next rung of the half-decade ladder
    when every rate lies on it, else one more geometric step of the grid's spacing at that end."""
    rates = sorted(lrs)
    if all(on_ladder(r) for r in rates):
        end = rates[0] if side == "low" else rates[-1]
        exponent, mantissa = math.floor(math.log10(end) + 1e-9), end / 10 ** math.floor(math.log10(end) + 1e-9)
        up = 3.0 if mantissa < 2 else 10.0
        down = 0.3 if mantissa < 2 else 1.0
        return float(f"{(up if side == 'high' else down) * 10**exponent:.6g}")
    if len(rates) < 2:
        return rates[0] * (3.0 if side == "high" else 1 / 3)
    step = rates[-1] / rates[-2] if side == "high" else rates[0] / rates[1]
    return float(f"{(rates[-1] if side == 'high' else rates[0]) * step:.6g}")


def bracket_table(
    trials: pd.DataFrame, select_by: str = "best_val_acc", keys: tuple[str, ...] = ("components",)
) -> pd.DataFrame:
    """Tell, per configuration, whether its best learning rate is bracketed, and which rate to try next when not.

    A rate whose runs all lack ``select_by`` (diverged before any evaluation) counts as the worst, so a rate tried
    once is never asked for again.

    Args:
        trials: The trial table.
        select_by: The metric the best rate is chosen by (its mean over seeds).
        keys: The columns that make a configuration (components as subset names).

    Returns:
        One row per configuration: the rates it was trained at, the one with the best mean ``select_by`` over seeds,
        where that rate lies (``position``: interior, low edge, high edge, or one rate) and ``next_lr``, the rate to
        try beyond that edge (NaN when interior).

    Raises:
        UserError: The trial table lacks a column it needs.
    """
    require_columns(trials, [*keys, "lr", select_by])
    frame = trials[[*keys, "lr"]].copy()
    frame["components"] = [subset_name(c) for c in trials["components"]] if "components" in keys else None
    frame["_select"] = numeric(trials[select_by])
    rows = []
    for key, runs in frame.groupby(list(keys), sort=False, dropna=False):
        means = runs.groupby("lr")["_select"].mean().fillna(-np.inf).sort_index()
        lrs = [float(v) for v in means.index]
        best = float(means.idxmax())
        position = SINGLE if len(lrs) == 1 else LOW if best == lrs[0] else HIGH if best == lrs[-1] else INTERIOR
        side = {LOW: "low", HIGH: "high"}.get(position)
        if position == SINGLE:  # one rate: try above it (a lab's grid always has more than one)
            side = "high"
        key = key if isinstance(key, tuple) else (key,)
        rows.append(
            {
                **dict(zip(keys, key)),
                "lrs": lrs,
                "best_lr": best,
                "position": position,
                "next_lr": next_rate(lrs, side) if side else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=[*keys, "lrs", "best_lr", "position", "next_lr"])


def extension_groups(table: pd.DataFrame) -> dict[float, list[str]]:
    """The configurations at an edge, grouped by the rate to try next: {rate: [components, ...]}, rates ascending."""
    edges = table[table["position"] != INTERIOR]
    groups: dict[float, list[str]] = {}
    for row in edges.sort_values("next_lr").itertuples():
        groups.setdefault(float(row.next_lr), []).append(row.components)
    return groups
