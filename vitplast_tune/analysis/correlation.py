"""Compute rank correlations with bootstrap intervals, compare two predictors, and word a difference's verdict."""

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
    """Correlate each predictor column with ``target`` by Spearman and Kendall, with paired BCa 95% intervals.

    Args:
        trials: The trial table.
        predictors: The predictor columns.
        target: The column they should predict.
        n_boot: Bootstrap resamples.
        seed: The bootstrap's seed.
        min_trials: The fewest trials with finite values that get statistics.

    Returns:
        One row per predictor. ``n`` counts the trials where both values are finite. When the statistics are NaN,
        ``note`` says why.

    Raises:
        UserError: If the trial table lacks a column it needs.
    """
    _require_columns(trials, [*predictors, target])
    y_all = _numeric(trials[target])
    rows = []
    for predictor in predictors:
        x_all = _numeric(trials[predictor])
        keep = np.isfinite(x_all) & np.isfinite(y_all)
        x, y = x_all[keep], y_all[keep]
        row: dict[str, Any] = {"predictor": predictor, "target": target, "n": int(keep.sum())}
        row.update(dict.fromkeys(_stat_columns(), math.nan))
        row.update(n_boot=0, note="")
        if len(x) < min_trials:
            row["note"] = f"too few finished trials (n < {min_trials})"
        elif _is_constant(x) or _is_constant(y):
            row["note"] = f"{'predictor' if _is_constant(x) else 'target'} is constant"
        else:
            row.update(point_stats(x, y))
            for name, statistic in _RANK_STATS.items():
                found = bca((x, y), statistic, n_boot=n_boot, seed=seed, vectorized=True)
                row[f"{name}_low"], row[f"{name}_high"] = found.low, found.high
            row["n_boot"] = max(n_boot, 0)
        rows.append(row)
    return pd.DataFrame(rows, columns=["predictor", "target", "n", *_stat_columns(), "n_boot", "note"])


def spearman(x: np.ndarray, y: np.ndarray, axis: int = -1) -> float | np.ndarray:
    """Compute Spearman's rho along ``axis``, vectorized over the other axes.

    Args:
        x: The first values.
        y: The second values, of ``x``'s shape.
        axis: The axis the points lie along.

    Returns:
        The rho, a float for one-dimensional inputs. It is NaN where either side is constant.
    """
    rx, ry = (stats.rankdata(v, axis=axis) for v in (x, y))
    rx = rx - rx.mean(axis=axis, keepdims=True)
    ry = ry - ry.mean(axis=axis, keepdims=True)
    den = np.sqrt((rx * rx).sum(axis=axis) * (ry * ry).sum(axis=axis))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(den > 0, (rx * ry).sum(axis=axis) / np.where(den > 0, den, 1.0), np.nan)
    return float(rho) if np.ndim(rho) == 0 else rho


def kendall(x: np.ndarray, y: np.ndarray, axis: int = -1) -> float | np.ndarray:
    """Compute Kendall's tau-b along ``axis``, vectorized over the other axes.

    Args:
        x: The first values.
        y: The second values, of ``x``'s shape.
        axis: The axis the points lie along.

    Returns:
        The tau, a float for one-dimensional inputs. It is NaN where either side is constant.
    """
    x, y = np.moveaxis(np.asarray(x, dtype=float), axis, -1), np.moveaxis(np.asarray(y, dtype=float), axis, -1)
    shape, n = x.shape[:-1], x.shape[-1]
    x, y = x.reshape(-1, n), y.reshape(-1, n)
    if n > _PAIRWISE_MAX:  # scipy's O(n log n) per row is faster here; below, all pairs at once take milliseconds
        tau = np.array(
            [math.nan if _is_constant(a) or _is_constant(b) else stats.kendalltau(a, b).statistic for a, b in zip(x, y)]
        )
    else:
        step = max(1, _PAIRWISE_CHUNK // (n * n))
        tau = np.concatenate([_pairwise_tau(x[i : i + step], y[i : i + step]) for i in range(0, len(x), step)])
    return float(tau[0]) if not shape else tau.reshape(shape)


def _pairwise_tau(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Compute Kendall's tau-b of each row from the signs of all pairwise differences."""
    sx = np.sign(x[:, :, None] - x[:, None, :]).astype(np.float32)  # each pair counts twice, and the factor cancels
    sy = np.sign(y[:, :, None] - y[:, None, :]).astype(np.float32)
    both = np.einsum("kij,kij->k", sx, sy, dtype=np.float64)
    den = np.sqrt(np.count_nonzero(sx, axis=(1, 2)).astype(float) * np.count_nonzero(sy, axis=(1, 2)))
    return np.where(den > 0, both / np.where(den > 0, den, 1.0), np.nan)


_PAIRWISE_MAX = 100  # the most points for the pairwise tau
_PAIRWISE_CHUNK = 1 << 22  # pairwise signs per chunk of rows, 16 MB per float32 array
_RANK_STATS: dict[str, Callable[..., Any]] = {"spearman": spearman, "kendall": kendall}
MIN_POINTS = 12  # fewer rows get no verdict; python -m benchmarks.coverage measured the BCa coverage by n


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
    """Bootstrap ``stat(predictor) - stat(baseline)`` for ``target`` with its BCa interval, p-value and verdict."""
    _require_columns(trials, [predictor, baseline, target])
    x1, x2, y = (_numeric(trials[c]) for c in (predictor, baseline, target))
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
    if len(y) < 3 or _is_constant(y):
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
    """Word a difference's interval over ``n`` rows: better, worse, no clear difference, undetermined or no verdict."""
    if n < min_points:
        return f"no verdict (n < {min_points})"
    if not (np.isfinite(low) and np.isfinite(high)):
        return "undetermined"
    return "better" if low > 0 else "worse" if high < 0 else "no clear difference"


def partial_spearman(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> float:
    """Compute the Spearman of x and y controlling for z, from the rank residuals of a line fit on z's ranks."""
    if len(np.unique(np.column_stack([x, y, z]), axis=0)) < 4:  # with 3 rows the residuals correlate by ±1
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
    """Compute each predictor's partial Spearman with ``target``, controlling for ``control``, with BCa intervals."""
    _require_columns(trials, [*predictors, target, control])
    y_all, z_all = _numeric(trials[target]), _numeric(trials[control])
    rows = []
    for predictor in predictors:
        x_all = _numeric(trials[predictor])
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
        elif _is_constant(x) or _is_constant(y):
            row["note"] = f"{'predictor' if _is_constant(x) else 'target'} is constant"
        else:
            row["partial_spearman"] = partial_spearman(x, y, z)
            found = bca((x, y, z), partial_spearman, n_boot=n_boot, seed=seed)
            row["partial_low"], row["partial_high"] = found.low, found.high
        rows.append(row)
    return pd.DataFrame(rows)


def interval(low: float, high: float) -> str:
    """Write an interval as "[low, high]", or "[undetermined]" when it is NaN."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "[undetermined]"
    return f"[{low:+.2f}, {high:+.2f}]"


def _require_columns(frame: pd.DataFrame, columns: list[str]) -> None:
    """Raise UserError naming the first of ``columns`` that ``frame`` lacks."""
    for column in columns:
        if column not in frame.columns:
            hint = did_you_mean(column, frame.columns)
            raise UserError(f'no column "{column}"{hint}; columns are {", ".join(map(str, frame.columns))}')


def _stat_columns() -> list[str]:
    """Return the statistic columns of a correlation row."""
    return [f"{s}{suffix}" for s in _STATS for suffix in ("", "_low", "_high", "_p")]


def _numeric(column: pd.Series) -> np.ndarray:
    """Return a column as floats, with NaN for non-numbers."""
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)


def _is_constant(values: np.ndarray) -> bool:
    """Return whether every value is the same."""
    return len(values) == 0 or bool(np.all(values == values[0]))


EXACT_BELOW = 10  # fewer points get exact p-values from every pairing, at most 9! = 362,880


def point_stats(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Compute Spearman and Kendall with two-sided p-values, exact below ``EXACT_BELOW`` points."""
    rho, tau = stats.spearmanr(x, y), stats.kendalltau(x, y)
    small = len(x) < EXACT_BELOW
    return {
        "spearman": rho.statistic,
        "spearman_p": permutation_p(x, y, spearman) if small else rho.pvalue,
        "kendall": tau.statistic,
        "kendall_p": permutation_p(x, y, kendall) if small else tau.pvalue,
    }


def permutation_p(x: np.ndarray, y: np.ndarray, statistic: Callable[..., Any] | None = None) -> float:
    """Compute the exact two-sided permutation p-value of a rank correlation by enumerating all ``n!`` pairings."""
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


_PERMUTATION_CHUNK = 40_320  # 8! pairings per vectorized call


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
    """Compare each predictor with ``baseline`` on the rows where both and ``target`` are finite.

    Args:
        frame: The rows, trials or configurations.
        predictors: The predictor columns.
        baseline: The baseline's column.
        target: The column they should predict.
        n_boot: Bootstrap resamples.
        seed: The bootstrap's seed.
        min_trials: The fewest rows that get correlations.
        min_points: The fewest rows that get a verdict.

    Returns:
        One row per predictor with its correlations, ``baseline_spearman``, the difference ``diff_vs_baseline`` with
        its interval, and the verdict.

    Raises:
        UserError: If the frame lacks a column it needs.
    """
    _require_columns(frame, [*predictors, baseline, target])
    base = _numeric(frame[baseline])
    rows = []
    for predictor in predictors:
        common = frame[np.isfinite(base) & np.isfinite(_numeric(frame[predictor]))]
        row = correlations(common, [predictor], target, n_boot=n_boot, seed=seed, min_trials=min_trials).iloc[0]
        row = row.to_dict()
        row.update(baseline_spearman=math.nan, diff_vs_baseline=math.nan, diff_low=math.nan, diff_high=math.nan)
        row.update(diff_p=math.nan, verdict="")
        if predictor != baseline and not row["note"]:
            y = _numeric(common[target])
            kept = common[np.isfinite(y)]
            row["baseline_spearman"] = spearman(_numeric(kept[baseline]), _numeric(kept[target]))
            c = compare_predictors(common, predictor, baseline, target, n_boot=n_boot, seed=seed, min_points=min_points)
            row.update(diff_vs_baseline=c["diff"], diff_low=c["diff_low"], diff_high=c["diff_high"])
            row.update(diff_p=c["p"], verdict=c["verdict"])
        rows.append(row)
    return pd.DataFrame(rows)
