"""Rank statistics with scipy: Spearman and Kendall with BCa bootstrap intervals, the paired bootstrap of
the difference between two predictors, and partial correlations.

Pure functions on pandas objects; every resample keeps pairs together (``scipy.stats.bootstrap``, paired).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

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
    """Spearman and Kendall correlation of each predictor column with ``target``, with paired BCa 95% intervals.

    One row per predictor; ``n`` counts the trials where both are finite. With fewer than
    ``min_trials`` (or a constant column) the statistics are NaN and ``note`` says why. Intervals come
    from ``scipy.stats.bootstrap`` (paired, BCa, seeded); a resample with a constant column counts as 0.
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
                row[f"{name}_low"], row[f"{name}_high"] = bca_interval((x, y), statistic, n_boot=n_boot, seed=seed)
            row["n_boot"] = max(n_boot, 0)
        rows.append(row)
    return pd.DataFrame(rows, columns=["predictor", "target", "n", *stat_columns(), "n_boot", "note"])


def bca_interval(
    data: tuple[np.ndarray, ...],
    statistic: Callable[..., float],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Paired BCa bootstrap interval of ``statistic(*data)`` (``scipy.stats.bootstrap``); NaN when ``n_boot`` is 0.

    A bootstrap distribution with a single value (e.g. a perfect rank correlation) gives that value twice.
    """
    if n_boot <= 0:
        return math.nan, math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns about degenerate distributions, handled below
        res = stats.bootstrap(
            data,
            statistic,
            paired=True,
            vectorized=False,
            n_resamples=n_boot,
            method="BCa",
            confidence_level=level,
            rng=np.random.default_rng(seed),
        )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    boot = np.asarray(res.bootstrap_distribution, dtype=float)
    if not (np.isfinite(low) and np.isfinite(high)) and np.allclose(boot, boot[0], rtol=0, atol=1e-9):
        return float(boot[0]), float(boot[0])
    return low, high


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho (scipy), and 0 when either side is constant (no rank association can be seen)."""
    return 0.0 if is_constant(x) or is_constant(y) else float(stats.spearmanr(x, y).statistic)


def kendall(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b (scipy), and 0 when either side is constant."""
    return 0.0 if is_constant(x) or is_constant(y) else float(stats.kendalltau(x, y).statistic)


_RANK_STATS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {"spearman": spearman, "kendall": kendall}


def compare_predictors(
    trials: pd.DataFrame,
    predictor: str,
    baseline: str,
    target: str,
    *,
    stat: str = "spearman",
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Is ``predictor`` a better rank predictor of ``target`` than ``baseline``? A paired bootstrap of the difference.

    Returns n, diff = stat(predictor) - stat(baseline) on the rows where all three are finite, its BCa 95%
    interval, and verdict "better" (interval above 0), "worse" (below 0) or "no clear difference".
    """
    require_columns(trials, [predictor, baseline, target])
    x1, x2, y = (numeric(trials[c]) for c in (predictor, baseline, target))
    keep = np.isfinite(x1) & np.isfinite(x2) & np.isfinite(y)
    x1, x2, y = x1[keep], x2[keep], y[keep]
    f = _RANK_STATS[stat]
    diff = lambda a, b, t: f(a, t) - f(b, t)
    out = {
        "predictor": predictor,
        "baseline": baseline,
        "target": target,
        "stat": stat,
        "n": int(keep.sum()),
        "diff": math.nan,
        "diff_low": math.nan,
        "diff_high": math.nan,
        "verdict": "too few rows",
    }
    if len(y) < 3 or is_constant(y):
        return out
    low, high = bca_interval((x1, x2, y), diff, n_boot=n_boot, seed=seed)
    verdict = "better" if low > 0 else "worse" if high < 0 else "no clear difference"
    return {**out, "diff": diff(x1, x2, y), "diff_low": low, "diff_high": high, "verdict": verdict}


def partial_spearman(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> float:
    """Spearman of x and y controlling for z: Pearson of the ranks' residuals after a linear fit on z's ranks."""
    rx, ry, rz = (stats.rankdata(v) for v in (x, y, z))
    design = np.column_stack([np.ones_like(rz), rz])
    res_x = rx - design @ np.linalg.lstsq(design, rx, rcond=None)[0]
    res_y = ry - design @ np.linalg.lstsq(design, ry, rcond=None)[0]
    if np.allclose(res_x, 0) or np.allclose(res_y, 0):
        return 0.0
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
            interval = bca_interval((x, y, z), partial_spearman, n_boot=n_boot, seed=seed)
            row["partial_low"], row["partial_high"] = interval
        rows.append(row)
    return pd.DataFrame(rows)


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


def point_stats(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Spearman and Kendall of two samples with their p-values."""
    spearman, kendall = stats.spearmanr(x, y), stats.kendalltau(x, y)
    return {
        "spearman": spearman.statistic,
        "spearman_p": spearman.pvalue,
        "kendall": kendall.statistic,
        "kendall_p": kendall.pvalue,
    }


def baseline_differences(
    table: pd.DataFrame, frame: pd.DataFrame, baseline: str, *, n_boot: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """``table`` (rows of ``correlations``) with each predictor's paired-bootstrap Spearman difference against
    ``baseline`` on ``frame`` (``compare_predictors``): diff_vs_baseline, diff_low, diff_high and verdict."""
    table = table.copy()
    for column in ("diff_vs_baseline", "diff_low", "diff_high"):
        table[column] = math.nan
    table["verdict"] = ""
    for i, row in table.iterrows():
        if row["predictor"] == baseline or row["note"] or baseline not in frame:
            continue
        c = compare_predictors(frame, row["predictor"], baseline, row["target"], n_boot=n_boot, seed=seed)
        table.loc[i, ["diff_vs_baseline", "diff_low", "diff_high", "verdict"]] = [
            c["diff"],
            c["diff_low"],
            c["diff_high"],
            c["verdict"],
        ]
    return table
