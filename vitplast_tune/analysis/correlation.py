"""Rank statistics with scipy: Spearman and Kendall with BCa bootstrap intervals (``bootstrap``), the paired
bootstrap of the difference between two predictors, and partial correlations.

Pure functions on pandas objects; every resample keeps pairs together. A statistic is NaN on a resample where it is
undefined (a constant column; a partial correlation with fewer than 4 distinct rows): such resamples are left out of
the interval, which is undetermined (NaN) when more than ``bootstrap.MAX_DEGENERATE`` of them are. Below
``MIN_POINTS`` rows a comparison gives its figures and no verdict: ``python -m benchmarks.coverage``
(docs/benchmarks.md) measured the BCa intervals' coverage by sample size.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from vitplast_tune.analysis.bootstrap import bca
from vitplast_tune.errors import UserError, did_you_mean

_STATS = ("spearman", "kendall")


def correlations(
    trials: pd.DataFrame,
    predictors: list[str],
    target: str = "val_acc",
    *,
    n_boot: int = 1000,
    seed: int = 0,
    min_trials: int = 5,
) -> pd.DataFrame:
    """Correlate each predictor column with ``target``: Spearman and Kendall, with paired BCa 95% intervals.

    Intervals come from ``scipy.stats.bootstrap`` (paired, BCa, seeded; see ``bootstrap.bca`` for resamples with a
    constant column).

    Args:
        trials: The trial table.
        predictors: The predictor columns.
        target: The column they should predict.
        n_boot: Bootstrap resamples.
        seed: The bootstrap's seed.
        min_trials: The fewest trials with finite values that get statistics.

    Returns:
        One row per predictor; ``n`` counts the trials where both are finite. With fewer than ``min_trials`` (or a
        constant column) the statistics are NaN and ``note`` says why.

    Raises:
        UserError: The trial table lacks a column it needs.
    """
    require_columns(trials, [*predictors, target])
    y_all = numeric(trials[target])
    rows = []
    for predictor in predictors:
        x_all = numeric(trials[predictor])
        keep = np.isfinite(x_all) & np.isfinite(y_all)
        x, y = x_all[keep], y_all[keep]
        row: dict[str, Any] = {"predictor": predictor, "target": target, "n": int(keep.sum())}
        row.update(dict.fromkeys(stat_columns(), math.nan))
        row.update(n_boot=0, note="")
        if len(x) < min_trials:
            row["note"] = f"too few finished trials (n < {min_trials})"
        elif is_constant(x) or is_constant(y):
            row["note"] = f"{'predictor' if is_constant(x) else 'target'} is constant"
        else:
            row.update(point_stats(x, y))
            for name, statistic in _RANK_STATS.items():
                found = bca((x, y), statistic, n_boot=n_boot, seed=seed, vectorized=True)
                row[f"{name}_low"], row[f"{name}_high"] = found.low, found.high
            row["n_boot"] = max(n_boot, 0)
        rows.append(row)
    return pd.DataFrame(rows, columns=["predictor", "target", "n", *stat_columns(), "n_boot", "note"])


def spearman(x: np.ndarray, y: np.ndarray, axis: int = -1) -> float | np.ndarray:
    """Compute Spearman's rho along ``axis``, vectorized over the other axes.

    It is the Pearson correlation of average ranks, as ``scipy.stats.spearmanr``.

    Args:
        x: The first values.
        y: The second values, of ``x``'s shape.
        axis: The axis the points lie along.

    Returns:
        The rho (a float for one-dimensional inputs, else an array over the other axes); NaN where either side is
        constant (no rank correlation is defined).
    """
    rx, ry = (stats.rankdata(v, axis=axis) for v in (x, y))
    rx = rx - rx.mean(axis=axis, keepdims=True)
    ry = ry - ry.mean(axis=axis, keepdims=True)
    den = np.sqrt((rx * rx).sum(axis=axis) * (ry * ry).sum(axis=axis))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(den > 0, (rx * ry).sum(axis=axis) / np.where(den > 0, den, 1.0), np.nan)
    return float(rho) if np.ndim(rho) == 0 else rho


def kendall(x: np.ndarray, y: np.ndarray, axis: int = -1) -> float | np.ndarray:
    """Compute Kendall's tau-b along ``axis`` (as ``scipy.stats.kendalltau``), vectorized over the other axes.

    Up to ``_PAIRWISE_MAX`` points, from the signs of all pairwise differences at once (concordant minus discordant
    pairs over the geometric mean of the pairs untied in x and in y): a bootstrap's thousand resamples of a small
    search take milliseconds instead of a scipy call each. Beyond it, scipy's O(n log n) per row is faster.

    Args:
        x: The first values.
        y: The second values, of ``x``'s shape.
        axis: The axis the points lie along.

    Returns:
        The tau (a float for one-dimensional inputs, else an array over the other axes); NaN where either side is
        constant.
    """
    x, y = np.moveaxis(np.asarray(x, dtype=float), axis, -1), np.moveaxis(np.asarray(y, dtype=float), axis, -1)
    shape, n = x.shape[:-1], x.shape[-1]
    x, y = x.reshape(-1, n), y.reshape(-1, n)
    if n > _PAIRWISE_MAX:
        tau = np.array(
            [math.nan if is_constant(a) or is_constant(b) else stats.kendalltau(a, b).statistic for a, b in zip(x, y)]
        )
    else:
        step = max(1, _PAIRWISE_CHUNK // (n * n))
        tau = np.concatenate([_pairwise_tau(x[i : i + step], y[i : i + step]) for i in range(0, len(x), step)])
    return float(tau[0]) if not shape else tau.reshape(shape)


def _pairwise_tau(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of each row of ``x`` and ``y`` (rows, points) from the signs of all pairwise differences."""
    sx = np.sign(x[:, :, None] - x[:, None, :]).astype(np.float32)  # each pair twice: the factor cancels
    sy = np.sign(y[:, :, None] - y[:, None, :]).astype(np.float32)
    both = np.einsum("kij,kij->k", sx, sy, dtype=np.float64)
    den = np.sqrt(np.count_nonzero(sx, axis=(1, 2)).astype(float) * np.count_nonzero(sy, axis=(1, 2)))
    return np.where(den > 0, both / np.where(den > 0, den, 1.0), np.nan)


_PAIRWISE_MAX = 100  # points; above it scipy's per-row call is faster than the pairwise one
_PAIRWISE_CHUNK = 1 << 22  # pairwise signs per chunk of rows: 16 MB per float32 array
_RANK_STATS: dict[str, Callable[..., Any]] = {"spearman": spearman, "kendall": kendall}
MIN_POINTS = 12  # fewer rows: figures without a verdict (the BCa coverage by n: python -m benchmarks.coverage)


def compare_predictors(
    trials: pd.DataFrame,
    predictor: str,
    baseline: str,
    target: str,
    *,
    stat: str = "spearman",
    n_boot: int = 1000,
    seed: int = 0,
    min_points: int = MIN_POINTS,
    level: float = 0.95,
) -> dict[str, Any]:
    """Is ``predictor`` a better rank predictor of ``target`` than ``baseline``? A paired bootstrap of the difference.

    Returns n, diff = stat(predictor) - stat(baseline) on the rows where all three are finite, its BCa interval at
    ``level``, the matching two-sided p-value of 0 (``bootstrap.bca``, from the same resamples), and ``verdict``: "better" (interval above 0), "worse"
    (below 0), "no clear difference", "undetermined" (the interval could not be formed), or "no verdict (n <
    min_points)". A family of such comparisons adjusts ``p`` and ``level`` (``multiple``).
    """
    require_columns(trials, [predictor, baseline, target])
    x1, x2, y = (numeric(trials[c]) for c in (predictor, baseline, target))
    keep = np.isfinite(x1) & np.isfinite(x2) & np.isfinite(y)
    x1, x2, y = x1[keep], x2[keep], y[keep]
    f = _RANK_STATS[stat]

    def diff(a, b, t, axis=-1):
        return f(a, t, axis) - f(b, t, axis)

    out = {
        "predictor": predictor,
        "baseline": baseline,
        "target": target,
        "stat": stat,
        "n": int(keep.sum()),
        "diff": math.nan,
        "diff_low": math.nan,
        "diff_high": math.nan,
        "p": math.nan,
        "verdict": "too few rows",
    }
    if len(y) < 3 or is_constant(y):
        return out
    low, high, p = bca((x1, x2, y), diff, n_boot=n_boot, seed=seed, level=level, vectorized=True, null=0.0)
    return {
        **out,
        "diff": float(diff(x1, x2, y)),
        "diff_low": low,
        "diff_high": high,
        "p": p if np.isfinite(low) else math.nan,
        "verdict": verdict(low, high, len(y), min_points),
    }


def verdict(low: float, high: float, n: int, min_points: int = MIN_POINTS) -> str:
    """The word for a difference's interval [low, high] over n rows: better, worse, no clear difference,
    undetermined (NaN interval), or no verdict below ``min_points`` rows."""
    if n < min_points:
        return f"no verdict (n < {min_points})"
    if not (np.isfinite(low) and np.isfinite(high)):
        return "undetermined"
    return "better" if low > 0 else "worse" if high < 0 else "no clear difference"


def partial_spearman(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> float:
    """Spearman of x and y controlling for z: Pearson of the ranks' residuals after a linear fit on z's ranks.

    NaN when it is undefined: fewer than 4 distinct (x, y, z) rows (with 3, the residuals of a line through
    them are ±1 correlated whatever the data) or a residual that is all zero (x or y a function of z's ranks).
    """
    if len(np.unique(np.column_stack([x, y, z]), axis=0)) < 4:
        return math.nan
    rx, ry, rz = (stats.rankdata(v) for v in (x, y, z))
    design = np.column_stack([np.ones_like(rz), rz])
    res_x = rx - design @ np.linalg.lstsq(design, rx, rcond=None)[0]
    res_y = ry - design @ np.linalg.lstsq(design, ry, rcond=None)[0]
    if np.allclose(res_x, 0) or np.allclose(res_y, 0):
        return math.nan
    return float(np.corrcoef(res_x, res_y)[0, 1])


def partial_correlations(
    trials: pd.DataFrame,
    predictors: list[str],
    target: str = "val_acc",
    control: str = "lr",
    *,
    n_boot: int = 1000,
    seed: int = 0,
    min_trials: int = 5,
) -> pd.DataFrame:
    """Partial Spearman of each predictor with ``target`` controlling for ``control`` (log lr: ranks are the same).

    One row per predictor: n, partial_spearman and its paired BCa 95% interval, note.
    """
    require_columns(trials, [*predictors, target, control])
    y_all, z_all = numeric(trials[target]), numeric(trials[control])
    rows = []
    for predictor in predictors:
        x_all = numeric(trials[predictor])
        keep = np.isfinite(x_all) & np.isfinite(y_all) & np.isfinite(z_all)
        x, y, z = x_all[keep], y_all[keep], z_all[keep]
        row = {
            "predictor": predictor,
            "target": target,
            "control": control,
            "n": int(keep.sum()),
            "partial_spearman": math.nan,
            "partial_low": math.nan,
            "partial_high": math.nan,
            "note": "",
        }
        if len(x) < min_trials:
            row["note"] = f"too few finished trials (n < {min_trials})"
        elif is_constant(x) or is_constant(y):
            row["note"] = f"{'predictor' if is_constant(x) else 'target'} is constant"
        else:
            row["partial_spearman"] = partial_spearman(x, y, z)
            found = bca((x, y, z), partial_spearman, n_boot=n_boot, seed=seed)
            row["partial_low"], row["partial_high"] = found.low, found.high
        rows.append(row)
    return pd.DataFrame(rows)


def interval(low: float, high: float) -> str:
    """An interval as text: [low, high], or "[undetermined]" when it could not be formed (NaN)."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "[undetermined]"
    return f"[{low:+.2f}, {high:+.2f}]"


def require_columns(frame: pd.DataFrame, columns: list[str]) -> None:
    """Raise UserError naming the first of ``columns`` that ``frame`` lacks."""
    for column in columns:
        if column not in frame.columns:
            hint = did_you_mean(column, frame.columns)
            raise UserError(f'no column "{column}"{hint}; columns are {", ".join(map(str, frame.columns))}')


def stat_columns() -> list[str]:
    """The statistic columns of a correlation row: spearman, kendall and their interval ends and p-values."""
    return [f"{s}{suffix}" for s in _STATS for suffix in ("", "_low", "_high", "_p")]


def numeric(column: pd.Series) -> np.ndarray:
    """A column as floats (non-numbers become NaN)."""
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)


def is_constant(values: np.ndarray) -> bool:
    """Whether every value is the same (no rank correlation is defined then)."""
    return len(values) == 0 or bool(np.all(values == values[0]))


EXACT_BELOW = 10  # fewer points: p-values by enumerating every pairing (at most 9! = 362,880), not an approximation


def point_stats(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Spearman and Kendall of two samples with their two-sided p-values: exact permutation p-values below
    ``EXACT_BELOW`` points (``permutation_p``), scipy's approximations from there on."""
    rho, tau = stats.spearmanr(x, y), stats.kendalltau(x, y)
    small = len(x) < EXACT_BELOW
    return {
        "spearman": rho.statistic,
        "spearman_p": permutation_p(x, y, spearman) if small else rho.pvalue,
        "kendall": tau.statistic,
        "kendall_p": permutation_p(x, y, kendall) if small else tau.pvalue,
    }


def permutation_p(x: np.ndarray, y: np.ndarray, statistic: Callable[..., Any] | None = None) -> float:
    """The exact two-sided permutation p-value of a rank correlation (default Spearman) of ``x`` and ``y``: the share of
    all ``n!`` pairings of ``y``'s values with ``x``'s whose statistic is at least as far from 0 as the observed one
    (ties in the data kept as they are). Every pairing is enumerated, in chunks: meant for ``n < EXACT_BELOW``."""
    statistic = statistic or spearman
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    observed = abs(float(statistic(x, y)))
    if not np.isfinite(observed):
        return math.nan
    pairings = itertools.permutations(range(len(y)))
    extreme = total = 0
    while chunk := list(itertools.islice(pairings, _PERMUTATION_CHUNK)):
        values = np.abs(statistic(np.broadcast_to(x, (len(chunk), len(x))), y[np.array(chunk)], -1))
        extreme += int(np.sum(values >= observed - 1e-12))
        total += len(chunk)
    return extreme / total


_PERMUTATION_CHUNK = 40_320  # pairings per vectorized call (8!)


def compare_with_baseline(
    frame: pd.DataFrame,
    predictors: list[str],
    baseline: str,
    target: str,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    min_trials: int = 5,
    min_points: int = MIN_POINTS,
) -> pd.DataFrame:
    """Compare each predictor with ``baseline`` on one common set of rows.

    The rows are those where the predictor, the baseline and ``target`` are all finite (``n``; for the baseline's own
    row, where it and the target are).

    Args:
        frame: The rows (trials, or configurations).
        predictors: The predictor columns.
        baseline: The baseline's column.
        target: The column they should predict.
        n_boot: Bootstrap resamples.
        seed: The bootstrap's seed.
        min_trials: The fewest rows that get correlations.
        min_points: The fewest rows that get a verdict.

    Returns:
        One row per predictor, on its rows: Spearman and Kendall of the predictor with BCa intervals
        (``correlations``), the baseline's Spearman (``baseline_spearman``), and the paired-bootstrap difference of
        the two Spearmans (``diff_vs_baseline`` = spearman - baseline_spearman, diff_low, diff_high) with its
        ``verdict`` (``compare_predictors``): no verdict below ``min_points`` rows, "undetermined" when the interval
        is NaN.

    Raises:
        UserError: The frame lacks a column it needs.
    """
    require_columns(frame, [*predictors, baseline, target])
    base = numeric(frame[baseline])
    rows = []
    for predictor in predictors:
        common = frame[np.isfinite(base) & np.isfinite(numeric(frame[predictor]))]
        row = correlations(common, [predictor], target, n_boot=n_boot, seed=seed, min_trials=min_trials).iloc[0]
        row = row.to_dict()
        row.update(baseline_spearman=math.nan, diff_vs_baseline=math.nan, diff_low=math.nan, diff_high=math.nan)
        row.update(diff_p=math.nan, verdict="")
        if predictor != baseline and not row["note"]:
            y = numeric(common[target])
            kept = common[np.isfinite(y)]
            row["baseline_spearman"] = spearman(numeric(kept[baseline]), numeric(kept[target]))
            c = compare_predictors(common, predictor, baseline, target, n_boot=n_boot, seed=seed, min_points=min_points)
            row.update(diff_vs_baseline=c["diff"], diff_low=c["diff_low"], diff_high=c["diff_high"])
            row.update(diff_p=c["p"], verdict=c["verdict"])
        rows.append(row)
    return pd.DataFrame(rows)
