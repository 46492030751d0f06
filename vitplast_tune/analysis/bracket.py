"""Find whether each configuration's best learning rate lies inside its grid, and the next rate to try if not."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from vitplast_tune.analysis.correlation import _numeric, _require_columns
from vitplast_tune.components import subset_name

LADDER = (1.0, 3.0)  # the shipped grids step by half decades: 0.03, 0.1, 0.3, 1, 3
INTERIOR, LOW, HIGH, SINGLE = "interior", "low edge", "high edge", "one rate"


def on_ladder(lr: float) -> bool:
    """Return whether ``lr`` is 1 or 3 times a power of ten, to 1%."""
    mantissa = lr / 10 ** math.floor(math.log10(lr))
    return any(abs(mantissa - m) < 0.01 * m for m in (*LADDER, 10.0))


def next_rate(lrs: list[float], side: str) -> float:
    """Return the next rate beyond the "low" or "high" end of ``lrs``, on the half-decade ladder where it fits."""
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

    Args:
        trials: The trial table.
        select_by: The metric whose mean over seeds picks the best rate.
        keys: The columns that make a configuration.

    Returns:
        One row per configuration with its rates, ``best_lr``, its ``position`` and ``next_lr``.

    Raises:
        UserError: If the trial table lacks a column it needs.
    """
    _require_columns(trials, [*keys, "lr", select_by])
    frame = trials[[*keys, "lr"]].copy()
    frame["components"] = [subset_name(c) for c in trials["components"]] if "components" in keys else None
    frame["_select"] = _numeric(trials[select_by])
    rows = []
    for key, runs in frame.groupby(list(keys), sort=False, dropna=False):
        # A rate whose runs all diverged before any evaluation counts as the worst, so no rate is asked for twice.
        means = runs.groupby("lr")["_select"].mean().fillna(-np.inf).sort_index()
        lrs = [float(v) for v in means.index]
        best = float(means.idxmax())
        position = SINGLE if len(lrs) == 1 else LOW if best == lrs[0] else HIGH if best == lrs[-1] else INTERIOR
        side = {LOW: "low", HIGH: "high"}.get(position)
        if position == SINGLE:  # try above a lone rate; a lab's grid always has more than one
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
    """Group the configurations at an edge by the rate to try next, rates ascending."""
    edges = table[table["position"] != INTERIOR]
    groups: dict[float, list[str]] = {}
    for row in edges.sort_values("next_lr").itertuples():
        groups.setdefault(float(row.next_lr), []).append(row.components)
    return groups
