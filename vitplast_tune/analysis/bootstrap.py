"""Compute a paired BCa bootstrap interval of a statistic and the p-value that matches it."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from scipy import special, stats

MAX_DEGENERATE = 0.05  # the interval is NaN when a larger share of resamples has no defined statistic


class Bca(NamedTuple):
    """Hold a BCa interval and the p-value of a null from the same resamples.

    Attributes:
        low: The interval's lower end, NaN when undetermined.
        high: The interval's upper end.
        p: The two-sided p-value of the null, NaN when none was asked or the interval is undetermined.
    """

    low: float
    high: float
    p: float = math.nan


def bca(
    data: tuple[np.ndarray, ...],
    statistic: Callable[..., Any],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    vectorized: bool = False,
    null: float | None = None,
) -> Bca:
    """Bootstrap a paired BCa interval of ``statistic(*data)``, leaving out resamples where it is NaN.

    Args:
        data: The paired samples, one array per argument of ``statistic``.
        statistic: The statistic of the samples.
        n_boot: How many resamples. 0 gives no interval.
        seed: The seed of the resamples.
        level: The confidence level.
        vectorized: Whether the statistic takes an ``axis``.
        null: The value whose p-value is wanted, or None for no p-value.

    Returns:
        The interval's ends and the p-value, the smallest ``1 - level`` whose interval reaches ``null``.
    """
    if n_boot <= 0:
        return Bca(math.nan, math.nan)
    res = _resampled(data, statistic, n_boot=n_boot, seed=seed, vectorized=vectorized, level=level)
    boot = np.asarray(res.bootstrap_distribution, dtype=float)
    p = math.nan if null is None else _p(data, statistic, boot, null)
    finite = np.isfinite(boot)
    if not finite.all():
        if finite.mean() < 1 - MAX_DEGENERATE:
            return Bca(math.nan, math.nan, p)
        return Bca(*bca_from_resamples(data, statistic, boot[finite], level=level), p)
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (np.isfinite(low) and np.isfinite(high)) and np.allclose(boot, boot[0], rtol=0, atol=1e-9):
        return Bca(float(boot[0]), float(boot[0]), p)
    return Bca(low, high, p)


def bca_from_resamples(
    data: tuple[np.ndarray, ...], statistic: Callable[..., Any], boot: np.ndarray, *, level: float = 0.95
) -> tuple[float, float]:
    """Compute Efron's BCa interval from finite bootstrap values by scipy's formulas; NaN ends where none forms."""
    parts = _bias_and_acceleration(data, statistic, boot)
    if parts is None:
        return math.nan, math.nan
    z0, accel = parts
    z = special.ndtri((1 - level) / 2)
    ends = [special.ndtr(z0 + (z0 + q) / (1 - accel * (z0 + q))) for q in (z, -z)]
    if not all(np.isfinite(ends)):
        return math.nan, math.nan
    low, high = np.percentile(boot, [100 * ends[0], 100 * ends[1]])
    return float(low), float(high)


def _p(data: tuple[np.ndarray, ...], statistic: Callable[..., Any], boot: np.ndarray, null: float) -> float:
    """Return the two-sided BCa p-value of ``null``, NaN when too many values are undefined."""
    finite = boot[np.isfinite(boot)]
    parts = _bias_and_acceleration(data, statistic, finite) if len(finite) >= (1 - MAX_DEGENERATE) * len(boot) else None
    if parts is None:
        return math.nan
    z0, accel = parts
    share = (np.sum(finite < null) + np.sum(finite <= null)) / (2 * len(finite))
    share = min(max(share, 0.5 / len(finite)), 1 - 0.5 / len(finite))
    w = special.ndtri(share) - z0
    tail = float(special.ndtr(w / (1 + accel * w) - z0))
    return min(1.0, 2 * min(tail, 1 - tail))


def _resampled(
    data: tuple[np.ndarray, ...],
    statistic: Callable[..., Any],
    *,
    n_boot: int,
    seed: int,
    vectorized: bool,
    level: float,
) -> Any:
    """Run scipy's paired BCa bootstrap, silencing its warnings because the caller handles degenerate cases."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return stats.bootstrap(
            data,
            statistic,
            paired=True,
            vectorized=vectorized,
            n_resamples=n_boot,
            method="BCa",
            confidence_level=level,
            rng=np.random.default_rng(seed),
        )


def _bias_and_acceleration(
    data: tuple[np.ndarray, ...], statistic: Callable[..., Any], boot: np.ndarray
) -> tuple[float, float] | None:
    """Return BCa's bias correction and acceleration, or None when they cannot be formed."""
    theta = float(statistic(*data))
    n = len(data[0])
    jack = np.array([statistic(*(d[np.arange(n) != i] for d in data)) for i in range(n)], dtype=float)
    jack = jack[np.isfinite(jack)]
    if not np.isfinite(theta) or len(boot) == 0 or len(jack) < 2:
        return None
    share = (np.sum(boot < theta) + np.sum(boot <= theta)) / (2 * len(boot))
    spread = jack.mean() - jack
    den = 6 * np.sum(spread**2) ** 1.5
    return float(special.ndtri(share)), float(np.sum(spread**3) / den if den > 0 else 0.0)
