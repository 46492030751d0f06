"""Judge a family of verdicts with Holm's correction, and give each an interval that agrees with its verdict."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

ALPHA = 0.05  # the family-wise error rate of every report's verdicts
CORRECTION = "holm"  # judge applies this statsmodels correction


def defined(samples) -> np.ndarray:
    """Return the finite bootstrap values of ``samples``, dropping resamples where the statistic is undefined."""
    values = np.asarray(samples if samples is not None else [], dtype=float)
    return values[np.isfinite(values)]


def bootstrap_p(samples: np.ndarray, null: float = 0.0) -> float:
    """Return the two-sided bootstrap p-value of ``null``: twice the smaller tail share, at most 1."""
    values = defined(samples)
    if len(values) == 0:
        return math.nan
    return float(min(1.0, 2 * min(np.mean(values <= null), np.mean(values >= null))))


def holm(p_values: ArrayLike) -> np.ndarray:
    """Adjust p-values by Holm's step-down method, leaving NaN entries out of the family.

    Args:
        p_values: One p-value per hypothesis, NaN for one not tested.

    Returns:
        The adjusted p-values, NaN where untested.
    """
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    tested = np.isfinite(p)
    if tested.any():
        out[tested] = multipletests(p[tested], method="holm")[1]
    return out


def interval_levels(p_values, alpha: float = ALPHA) -> np.ndarray:
    """Return each hypothesis's interval level: its Holm step when rejected, else Bonferroni's ``1 - alpha / m``."""
    p = np.asarray(p_values, dtype=float)
    levels = np.full(p.shape, np.nan)
    tested = np.flatnonzero(np.isfinite(p))
    m = len(tested)
    if m == 0:
        return levels
    steps = np.empty(m)
    steps[np.argsort(p[tested], kind="stable")] = m - np.arange(m)  # m - rank + 1, with ranks from 1
    levels[tested] = np.where(holm(p)[tested] < alpha, 1 - alpha / steps, 1 - alpha / m)
    return levels


def percentile_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """Return the percentile interval at ``level``, which excludes a value exactly when its p is below ``1 - level``."""
    values = defined(samples)
    if len(values) == 0 or not np.isfinite(level):
        return math.nan, math.nan
    tail = (1 - level) / 2
    low = np.quantile(values, tail, method="inverted_cdf")  # the smallest value with a share >= tail at or below it
    high = -np.quantile(-values, tail, method="inverted_cdf")  # the largest with a share >= tail at or above it
    return float(low), float(high)


def judge(
    estimates, samples: list[np.ndarray | None], p_values=None, *, alpha: float = ALPHA, labels=None
) -> pd.DataFrame:
    """Test "the statistic is 0" for each estimate as one Holm family, skipping those without p or samples."""
    estimates = np.asarray(estimates, dtype=float)
    given = list(p_values) if p_values is not None else [None] * len(samples)
    p = np.array(
        [g if g is not None else bootstrap_p(s) if s is not None else math.nan for g, s in zip(given, samples)],
        dtype=float,
    )
    adjusted, levels = holm(p), interval_levels(p, alpha)
    rows = []
    for i, s in enumerate(samples):
        low, high = percentile_interval(s, levels[i]) if s is not None else (math.nan, math.nan)
        tested = np.isfinite(p[i])
        word = "" if not tested else "not different from 0"
        if tested and adjusted[i] < alpha:
            word = "above 0" if estimates[i] > 0 else "below 0"
        rows.append(
            {"estimate": estimates[i], "p": p[i], "p_holm": adjusted[i], "level": levels[i], "low": low, "high": high}
            | {"verdict": word}
        )
    table = pd.DataFrame(rows)
    if labels is not None:
        table.insert(0, "hypothesis", list(labels))
    table.attrs.update(alpha=alpha, family=int(np.isfinite(p).sum()))
    return table


def _describe_level(level: float) -> str:
    """Write a confidence level as text, such as "99.4%"."""
    return "" if not np.isfinite(level) else f"{100 * level:.3g}%"
