"""Verdicts that control their family-wise error: bootstrap p-values, Holm's step-down adjustment over every verdict a
report prints (statsmodels' ``multipletests``), and the adjusted interval each verdict is printed with.

Holm (1979) keeps the chance of any false verdict in the family at ``alpha`` whatever the dependence between the
tests (the lab's comparisons share the same subsets and accuracies, so they are far from independent), and it rejects
everything Bonferroni does and more. Each hypothesis is printed with an interval at an adjusted level that agrees
with its verdict: a rejected one at its Holm step (``1 - alpha / (m - rank + 1)``), which excludes 0; one not rejected
at Bonferroni's ``1 - alpha / m``, which then includes 0 (its Bonferroni p, ``m * p``, is at least its Holm p). The
intervals are percentiles of the same bootstrap values the p-value counts (``inverted_cdf``), so the interval
excludes 0 exactly when the p-value is below its level.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

ALPHA = 0.05  # the family-wise error rate of every report's verdicts
CORRECTION = "holm"  # the correction ``judge`` applies (statsmodels multipletests' name; verdicts.CORRECTIONS)


def defined(samples) -> np.ndarray:
    """The finite bootstrap values of ``samples``: a statistic is undefined (NaN) on a resample where it has no value,
    a Spearman on a constant predictor say, and every figure of the resamples is taken over the others."""
    values = np.asarray(samples if samples is not None else [], dtype=float)
    return values[np.isfinite(values)]


def bootstrap_p(samples: np.ndarray, null: float = 0.0) -> float:
    """Two-sided bootstrap p-value of ``null``: twice the smaller share of the bootstrap values on either side of it
    (ties on both), at most 1; NaN without finite values."""
    values = defined(samples)
    if len(values) == 0:
        return math.nan
    return float(min(1.0, 2 * min(np.mean(values <= null), np.mean(values >= null))))


def holm(p_values: ArrayLike) -> np.ndarray:
    """Adjust p-values by Holm's step-down method (``statsmodels.stats.multitest.multipletests(method="holm")``).

    NaN entries are not tested: they neither count in the family nor get an adjusted value.

    Args:
        p_values: one p-value per hypothesis, NaN for one not tested.

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
    """The confidence level each hypothesis's interval is printed at: its Holm step ``1 - alpha / (m - rank + 1)`` when
    Holm rejects it (its adjusted p below ``alpha``, as ``judge`` words it), else Bonferroni's ``1 - alpha / m``.

    Args:
        p_values: one p-value per hypothesis, NaN for one not tested.
        alpha: the family-wise error rate.

    Returns:
        The levels, NaN where untested.
    """
    p = np.asarray(p_values, dtype=float)
    levels = np.full(p.shape, np.nan)
    tested = np.flatnonzero(np.isfinite(p))
    m = len(tested)
    if m == 0:
        return levels
    steps = np.empty(m)
    steps[np.argsort(p[tested], kind="stable")] = m - np.arange(m)  # m - rank + 1, the rank counted from 1
    levels[tested] = np.where(holm(p)[tested] < alpha, 1 - alpha / steps, 1 - alpha / m)
    return levels


def percentile_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval of bootstrap values at ``level`` (``inverted_cdf``: the interval excludes a value
    exactly when ``bootstrap_p`` of it is below ``1 - level``); NaN when there are none or no level."""
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
    """One family of hypotheses "the statistic is 0", one per estimate: p (the given ``p_values``, else
    ``bootstrap_p`` of its ``samples``), Holm's adjusted p, the adjusted interval and its level, and the verdict:
    "above 0", "below 0" (Holm's p below ``alpha``) or "not different from 0". An estimate with NaN p is not tested
    (no verdict, not counted in the family): pass neither samples nor a p-value for it."""
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


def describe_level(level: float) -> str:
    """An adjusted confidence level as text, e.g. "99.4%"."""
    return "" if not np.isfinite(level) else f"{100 * level:.3g}%"
