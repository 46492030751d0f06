"""Pure analysis of finished trials and plasticity tables: correlations, relative gains, tables, plots.

Every function takes pandas objects and returns pandas objects (or writes one PNG); nothing here
needs Ray or MLflow. Plots draw on ``matplotlib.figure.Figure`` directly (Agg rendering), so
importing this module never selects a pyplot backend.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
from scipy import stats

from vitplast_tune.components import ALL, BLOCK_COMPONENTS, HEAD, parse_subset, subset_name
from vitplast_tune.errors import UserError, did_you_mean

# The paper's order of single components (by plasticity), then the embedding, full finetuning, linear probe.
TABLE_ORDER: tuple[str, ...] = ("mha", "fc1", "fc2", "ln2", "ln1", "emb", ALL, HEAD)
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
        elif _constant(x) or _constant(y):
            row["note"] = f"{'predictor' if _constant(x) else 'target'} is constant"
        else:
            row.update(_point_stats(x, y))
            for name, statistic in _RANK_STATS.items():
                row[f"{name}_low"], row[f"{name}_high"] = bca_interval((x, y), statistic, n_boot=n_boot, seed=seed)
            row["n_boot"] = max(n_boot, 0)
        rows.append(row)
    return pd.DataFrame(rows, columns=["predictor", "target", "n", *_stat_columns(), "n_boot", "note"])


def bca_interval(
    data: tuple[np.ndarray, ...], statistic: Callable[..., float], *, n_boot: int = 1000, seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:  # fmt: skip
    """Paired BCa bootstrap interval of ``statistic(*data)`` (``scipy.stats.bootstrap``); NaN when ``n_boot`` is 0.

    A bootstrap distribution with a single value (e.g. a perfect rank correlation) gives that value twice.
    """
    if n_boot <= 0:
        return math.nan, math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns about degenerate distributions, handled below
        res = stats.bootstrap(data, statistic, paired=True, vectorized=False, n_resamples=n_boot, method="BCa",
                              confidence_level=level, rng=np.random.default_rng(seed))  # fmt: skip
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    boot = np.asarray(res.bootstrap_distribution, dtype=float)
    if not (np.isfinite(low) and np.isfinite(high)) and np.allclose(boot, boot[0], rtol=0, atol=1e-9):
        return float(boot[0]), float(boot[0])
    return low, high


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho (scipy), and 0 when either side is constant (no rank association can be seen)."""
    return 0.0 if _constant(x) or _constant(y) else float(stats.spearmanr(x, y).statistic)


def kendall(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b (scipy), and 0 when either side is constant."""
    return 0.0 if _constant(x) or _constant(y) else float(stats.kendalltau(x, y).statistic)


_RANK_STATS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {"spearman": spearman, "kendall": kendall}


def compare_predictors(
    trials: pd.DataFrame, predictor: str, baseline: str, target: str, *, stat: str = "spearman",
    n_boot: int = 1000, seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Is ``predictor`` a better rank predictor of ``target`` than ``baseline``? A paired bootstrap of the difference.

    Returns n, diff = stat(predictor) - stat(baseline) on the rows where all three are finite, its BCa 95%
    interval, and verdict "better" (interval above 0), "worse" (below 0) or "no clear difference".
    """
    _require_columns(trials, [predictor, baseline, target])
    x1, x2, y = (_numeric(trials[c]) for c in (predictor, baseline, target))
    keep = np.isfinite(x1) & np.isfinite(x2) & np.isfinite(y)
    x1, x2, y = x1[keep], x2[keep], y[keep]
    f = _RANK_STATS[stat]
    diff = lambda a, b, t: f(a, t) - f(b, t)  # noqa: E731
    out = {"predictor": predictor, "baseline": baseline, "target": target, "stat": stat, "n": int(keep.sum()),
           "diff": math.nan, "diff_low": math.nan, "diff_high": math.nan, "verdict": "too few rows"}  # fmt: skip
    if len(y) < 3 or _constant(y):
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
    trials: pd.DataFrame, predictors: list[str], target: str = "val_acc", control: str = "lr", *,
    n_boot: int = 1000, seed: int = 0, min_trials: int = 5,
) -> pd.DataFrame:  # fmt: skip
    """Partial Spearman of each predictor with ``target`` controlling for ``control`` (log lr: ranks are the same).

    One row per predictor: n, partial_spearman and its paired BCa 95% interval, note.
    """
    _require_columns(trials, [*predictors, target, control])
    y_all, z_all = _numeric(trials[target]), _numeric(trials[control])
    rows = []
    for predictor in predictors:
        x_all = _numeric(trials[predictor])
        keep = np.isfinite(x_all) & np.isfinite(y_all) & np.isfinite(z_all)
        x, y, z = x_all[keep], y_all[keep], z_all[keep]
        row = {"predictor": predictor, "target": target, "control": control, "n": int(keep.sum()),
               "partial_spearman": math.nan, "partial_low": math.nan, "partial_high": math.nan, "note": ""}  # fmt: skip
        if len(x) < min_trials:
            row["note"] = f"too few finished trials (n < {min_trials})"
        elif _constant(x) or _constant(y):
            row["note"] = f"{'predictor' if _constant(x) else 'target'} is constant"
        else:
            row["partial_spearman"] = partial_spearman(x, y, z)
            interval = bca_interval((x, y, z), partial_spearman, n_boot=n_boot, seed=seed)
            row["partial_low"], row["partial_high"] = interval
        rows.append(row)
    return pd.DataFrame(rows)


def relative_gain(acc, baseline_acc):
    """Relative gain over the linear probe, (acc - baseline_acc) / baseline_acc, as in the paper.

    Works on floats, numpy arrays and pandas Series alike; raises UserError for a zero baseline.
    """
    if np.any(np.asarray(baseline_acc, dtype=float) == 0):
        raise UserError("relative gain needs a non-zero baseline accuracy")
    return (acc - baseline_acc) / baseline_acc


def best_lr_table(trials: pd.DataFrame, target: str = "test_acc", *, select_by: str = "best_val_acc") -> pd.DataFrame:
    """Per configuration (any subset): the lr with the best mean ``select_by`` over seeds, and ``target`` there.

    Columns components, lr, mean, std (over seeds, ddof=1), n_seeds, n_lrs, n_runs, and relative_gain
    ((mean - probe) / probe, as in the paper) when the linear probe ("head") is present. Configurations
    come in the paper's order (TABLE_ORDER) first, then the others in order of appearance.
    """
    _require_columns(trials, ["components", "lr", target, select_by])
    frame = trials.loc[trials["components"].notna(), ["components", "lr"]].copy()
    frame["config"] = [_config_name(c) for c in frame["components"]]
    frame["_target"] = _numeric(trials.loc[frame.index, target])
    frame["_select"] = _numeric(trials.loc[frame.index, select_by])
    frame = frame[np.isfinite(frame["_target"]) & np.isfinite(frame["_select"])]
    seen = list(dict.fromkeys(frame["config"]))
    rows = []
    for config in [c for c in TABLE_ORDER if c in seen] + [c for c in seen if c not in TABLE_ORDER]:
        runs = frame[frame["config"] == config]
        by_lr = runs.groupby("lr")
        best_lr = by_lr["_select"].mean().idxmax()
        at_best = runs.loc[runs["lr"] == best_lr, "_target"]
        rows.append({"components": config, "lr": best_lr, "mean": at_best.mean(), "std": at_best.std(ddof=1),
                     "n_seeds": len(at_best), "n_lrs": by_lr.ngroups, "n_runs": len(runs)})  # fmt: skip
    table = pd.DataFrame(rows, columns=["components", "lr", "mean", "std", "n_seeds", "n_lrs", "n_runs"])
    head = table.loc[table["components"] == HEAD, "mean"]
    if len(head) and head.iloc[0] != 0:
        table["relative_gain"] = relative_gain(table["mean"], head.iloc[0])
    table.attrs.update(target=target, select_by=select_by)
    return table


def single_component_table(
    trials: pd.DataFrame, target: str = "val_acc", *, select_by: str | None = None
) -> pd.DataFrame:
    """``best_lr_table`` restricted to mha, fc1, fc2, ln2, ln1, emb, all, head (multi-component subsets left out)."""
    table = best_lr_table(trials, target, select_by=select_by or target)
    out = table[table["components"].isin(TABLE_ORDER)].reset_index(drop=True)
    out.attrs.update(table.attrs)
    return out


def component_plasticity(trials: pd.DataFrame, score: str = "plasticity_mean") -> pd.Series:
    """Plasticity per single block component, read from the ``score`` of its single-component trials."""
    if score not in trials:
        return pd.Series(dtype=float, name=score)
    names = pd.Series([_config_name(c) for c in trials["components"]], index=trials.index)
    values = pd.to_numeric(trials[score], errors="coerce").groupby(names).first()
    return values.reindex([c for c in BLOCK_COMPONENTS if c in values.index]).dropna().rename(score)


def rank_agreement(table: pd.DataFrame, plasticity: pd.Series, *, value: str | None = None) -> dict[str, Any]:
    """Spearman and Kendall between a per-component ``value`` (relative gain, else mean) and plasticity.

    Over the single block components present in both; with fewer than 3 the statistics are NaN.
    """
    value = value or ("relative_gain" if "relative_gain" in table else "mean")
    gains = table.set_index("components")[value]
    common = [c for c in BLOCK_COMPONENTS if c in gains.index and c in plasticity.index]
    x, y = plasticity[common].to_numpy(float), gains[common].to_numpy(float)
    out: dict[str, Any] = {"value": value, "n": len(common), "components": "+".join(common),
                           "by_value": " > ".join(gains[common].sort_values(ascending=False).index),
                           "by_plasticity": " > ".join(plasticity[common].sort_values(ascending=False).index),
                           }  # fmt: skip
    out.update(dict.fromkeys(_stat_columns(), math.nan))
    if len(common) >= 3 and not (_constant(x) or _constant(y)):
        out.update(_point_stats(x, y))
    return out


@dataclass
class PaperResults:
    """The paper-style results of a grid with seeds: per-configuration table, rank agreement, files."""

    table: pd.DataFrame
    agreement: dict[str, Any]
    files: list[Path]


def paper_results(trials: pd.DataFrame, out_dir: str | Path, *, plasticity: pd.Series | None = None) -> PaperResults:
    """Paper protocol on a trial table: best lr on validation (mean over seeds), test accuracy there, gains.

    ``plasticity`` per component defaults to the single-component trials' ``plasticity_mean``. Writes
    paper_table.csv, rank_agreement.csv and gain_vs_plasticity.png to ``out_dir``.
    """
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    select = "best_val_acc" if "best_val_acc" in trials else "val_acc"
    table = best_lr_table(trials, "test_acc", select_by=select)
    plasticity = component_plasticity(trials) if plasticity is None else plasticity
    agreement = rank_agreement(table, plasticity)
    files = [out / "paper_table.csv", out / "rank_agreement.csv"]
    table.to_csv(files[0], index=False)
    pd.DataFrame([agreement]).to_csv(files[1], index=False)
    files.append(plot_gain_and_plasticity(table, plasticity, out / "gain_vs_plasticity.png"))
    return PaperResults(table, agreement, files)


def describe_paper(results: PaperResults) -> str:
    """Plain lines: the paper-style table (test accuracy at the best validation lr) and the rank agreement."""
    t = results.table.copy()
    shown = pd.DataFrame({"components": t["components"], "best lr": t["lr"].map(lambda v: f"{v:.3g}"),
                          "test acc": [f"{100 * m:.2f} ± {100 * s:.2f}%" if np.isfinite(s) else f"{100 * m:.2f}%"
                                       for m, s in zip(t["mean"], t["std"])],
                          "seeds": t["n_seeds"]})  # fmt: skip
    if "relative_gain" in t:
        shown["gain vs probe"] = t["relative_gain"].map(lambda g: f"{100 * g:+.2f}%")
    a = results.agreement
    lines = ["Paper protocol: lr chosen on mean validation accuracy over seeds; test accuracy there (mean ± std):",
             shown.to_string(index=False)]  # fmt: skip
    if a["n"] >= 3 and np.isfinite(a["spearman"]):
        lines.append(f"  ranked by {a['value']}: {a['by_value']};  by plasticity: {a['by_plasticity']}")
        lines.append(f"  agreement over {a['n']} components: Spearman {a['spearman']:+.2f} (p={a['spearman_p']:.2g}), "
                     f"Kendall {a['kendall']:+.2f} (p={a['kendall_p']:.2g})")  # fmt: skip
    return "\n".join(lines)


def cross_dataset(
    tables: dict[str, pd.DataFrame], plasticity: dict[str, pd.Series]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Several searches (one per dataset) together: relative gain per component and dataset, and its mean.

    Returns (gains: one row per configuration, a column per dataset and ``mean_gain``; agreement: one row
    per dataset and a "pooled" row, mean gain vs mean plasticity over datasets, with Spearman and Kendall).
    """
    gains = pd.DataFrame({name: t.set_index("components")["relative_gain"] for name, t in tables.items()
                          if "relative_gain" in t})  # fmt: skip
    if gains.empty:
        raise UserError("no search has a linear probe (head) to measure relative gains against")
    order = [c for c in TABLE_ORDER if c in gains.index] + [c for c in gains.index if c not in TABLE_ORDER]
    gains = gains.reindex(order)
    gains["mean_gain"] = gains.mean(axis=1)
    rows = [{"dataset": name, **rank_agreement(tables[name], plasticity.get(name, pd.Series(dtype=float)))}
            for name in gains.columns[:-1]]  # fmt: skip
    pooled_plasticity = pd.concat([plasticity[n] for n in gains.columns[:-1] if n in plasticity], axis=1).mean(axis=1)
    pooled = gains["mean_gain"].rename("mean").rename_axis("components").reset_index()
    rows.append({"dataset": "pooled", **rank_agreement(pooled, pooled_plasticity, value="mean")})
    return gains.rename_axis("components").reset_index(), pd.DataFrame(rows)


# ----------------------------------------------------------------------------- plots


def plot_plasticity(table: pd.DataFrame, path: str | Path, *, title: str | None = None) -> Path:
    """Write a PNG: plasticity per layer (one line per block component) and per-component means with their spread."""
    from vitplast_tune.plasticity import aggregate_plasticity

    summary = aggregate_plasticity(table)
    fig, (left, right) = _figure(ncols=2, figsize=(11, 4.2))
    for component in BLOCK_COMPONENTS:
        rows = table[table["component"] == component].sort_values("layer")
        if len(rows):
            sem = _finite(rows.get("sem"))
            left.errorbar(rows["layer"], rows["plasticity"], yerr=sem, marker="o", capsize=2, label=component)
    left.set_xlabel("layer (block index)")
    left.set_ylabel("plasticity  ||f(x)-f(y)|| / ||x-y||")
    left.set_title("per layer")
    if left.has_data():
        left.legend(frameon=False)
        left.xaxis.get_major_locator().set_params(integer=True)
    x = np.arange(len(summary))
    colors = [f"C{BLOCK_COMPONENTS.index(c)}" if c in BLOCK_COMPONENTS else "0.6" for c in summary["component"]]
    right.bar(x, summary["plasticity"], yerr=_finite(summary["spread"]), color=colors, capsize=3)
    right.set_xticks(x, summary["component"])
    right.set_ylabel("mean over layers (± std over layers)")
    right.set_title("per component" + ("  (emb: vs pixels)" if "emb" in set(summary["component"]) else ""))
    variant = table.attrs.get("variant")
    fig.suptitle(title or f"Plasticity{f' ({variant} variant)' if variant else ''}")
    return _save(fig, path)


def plot_score_vs_accuracy(trials: pd.DataFrame, score: str, target: str, path: str | Path) -> Path:
    """Write a PNG scatter of ``target`` against ``score``, one point per trial, coloured by log10 learning rate."""
    _require_columns(trials, [score, target])
    x, y = _numeric(trials[score]), _numeric(trials[target])
    keep = np.isfinite(x) & np.isfinite(y)
    fig, (ax,) = _figure(ncols=1, figsize=(6, 4.5))
    lr = _numeric(trials["lr"]) if "lr" in trials.columns else None
    if lr is not None and np.all(lr[keep] > 0):
        points = ax.scatter(x[keep], y[keep], c=np.log10(lr[keep]), cmap="viridis", edgecolors="k", linewidths=0.3)
        fig.colorbar(points, ax=ax, label="log10 learning rate")
    else:
        ax.scatter(x[keep], y[keep], edgecolors="k", linewidths=0.3)
    ax.set_xlabel(score)
    ax.set_ylabel(target)
    xs, ys, n = x[keep], y[keep], int(keep.sum())
    rho = stats.spearmanr(xs, ys).statistic if n >= 2 and not (_constant(xs) or _constant(ys)) else math.nan
    ax.set_title(f"Spearman ρ = {rho:.3f} (n = {n})" if np.isfinite(rho) else f"Spearman ρ undefined (n = {n})")
    return _save(fig, path)


def plot_gain_and_plasticity(table: pd.DataFrame, plasticity: pd.Series, path: str | Path) -> Path:
    """Write a PNG like the paper's figure: relative gain (or test accuracy) per configuration beside plasticity."""
    value = "relative_gain" if "relative_gain" in table else "mean"
    shown = table[table["components"] != HEAD]
    fig, (left, right) = _figure(ncols=2, figsize=(11, 4.2))
    colors = [f"C{BLOCK_COMPONENTS.index(c)}" if c in BLOCK_COMPONENTS else "0.6" for c in shown["components"]]
    x = np.arange(len(shown))
    scale = 100 if value == "relative_gain" else 1
    left.bar(x, scale * shown[value], color=colors)
    left.set_xticks(x, shown["components"], rotation=30 if len(shown) > 8 else 0)
    left.set_ylabel("relative gain over the linear probe (%)" if value == "relative_gain" else "test accuracy")
    left.set_title("test accuracy at the best validation lr (mean over seeds)")
    order = [c for c in TABLE_ORDER if c in plasticity.index]
    xp = np.arange(len(order))
    right.bar(xp, plasticity[order], color=[f"C{BLOCK_COMPONENTS.index(c)}" for c in order])
    right.set_xticks(xp, order)
    right.set_ylabel("plasticity (mean over layers)")
    right.set_title("plasticity per component")
    return _save(fig, path)


# ----------------------------------------------------------------------------- internals


def _require_columns(frame: pd.DataFrame, columns: list[str]) -> None:
    for column in columns:
        if column not in frame.columns:
            hint = did_you_mean(column, frame.columns)
            raise UserError(f'no column "{column}"{hint}; columns are {", ".join(map(str, frame.columns))}')


def _stat_columns() -> list[str]:
    return [f"{s}{suffix}" for s in _STATS for suffix in ("", "_low", "_high", "_p")]


def _numeric(column: pd.Series) -> np.ndarray:
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)


def _constant(values: np.ndarray) -> bool:
    return len(values) == 0 or bool(np.all(values == values[0]))


def _point_stats(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    spearman, kendall = stats.spearmanr(x, y), stats.kendalltau(x, y)
    return {
        "spearman": spearman.statistic, "spearman_p": spearman.pvalue,
        "kendall": kendall.statistic, "kendall_p": kendall.pvalue,
    }  # fmt: skip


def _config_name(components: Any) -> str:
    """Canonical name of a trial's subset ("mha", "all", "head", "mha+fc1"), from a string or a list."""
    return subset_name(parse_subset(components))


def _finite(values: pd.Series | None) -> np.ndarray | None:
    if values is None:
        return None
    array = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    return np.where(np.isfinite(array), array, 0.0)


def _figure(ncols: int, figsize: tuple[float, float]):
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, list(np.atleast_1d(fig.subplots(1, ncols)))


def _save(fig, path: str | Path) -> Path:
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")
    return path


# ----------------------------------------------------------------------------- a finished search

SCORES: tuple[str, ...] = ("plasticity_mean", "plasticity_max", "plasticity_weighted")
BASELINE = "log_trainable_params"


@dataclass
class TrialAnalysis:
    """Plasticity vs accuracy over a search's finished trials, with the files written."""

    correlations: pd.DataFrame
    single_components: pd.DataFrame
    files: list[Path]
    n_finished: int


def finished_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials that trained their whole step budget without error or divergence (early-stopped ones are left out)."""
    ok = trials["step"].fillna(0) >= trials["max_steps"]
    if "diverged" in trials:
        ok &= ~trials["diverged"].astype(bool)
    if "error" in trials:
        ok &= trials["error"].isna()
    return trials[ok].copy()


def analyse_trials(
    trials: pd.DataFrame, out_dir: str | Path, *, target: str = "val_acc", min_trials: int = 5,
    n_boot: int = 1000, seed: int = 0,
) -> TrialAnalysis:  # fmt: skip
    """Correlate each plasticity score, and the naive baseline log(trainable parameters), with accuracy.

    Two views: final ``target`` of the finished trials (those that trained their whole budget),
    and, when the table has it, ``val_acc_common`` of every trial (accuracy at the last step all
    trials reached, the fair view under early stopping). Adds the relative gain over the linear
    probe when the search has head-only trials. Each row also carries the paired-bootstrap difference
    of its Spearman against the baseline's (diff_vs_baseline, diff_low, diff_high, verdict) and, when
    the learning rate varies, the partial Spearman controlling for it (partial_spearman, _low, _high).
    Writes correlations.csv, single_components.csv and scatter plots to ``out_dir``.
    """
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    trials = trials.copy()
    trials[BASELINE] = np.log(pd.to_numeric(trials["trainable_params"], errors="coerce").astype(float))
    done = finished_trials(trials)
    single = single_component_table(done, target) if len(done) else pd.DataFrame()
    views = [(target, done)]
    if "relative_gain" in single:
        done["relative_gain"] = relative_gain(_numeric(done[target]), single.loc[single["components"] == HEAD, "mean"].iloc[0])
        views.append(("relative_gain", done))
    if "val_acc_common" in trials and trials["val_acc_common"].notna().any():
        views.append(("val_acc_common", trials))
    predictors = [c for c in SCORES if c in trials] + [BASELINE]
    table = pd.concat(
        [_with_comparisons(correlations(frame, predictors, t, n_boot=n_boot, seed=seed, min_trials=min_trials),
                           frame, n_boot, seed, min_trials) for t, frame in views],
        ignore_index=True,
    )  # fmt: skip
    files = [out / "correlations.csv", out / "single_components.csv", out / "finished_trials.csv"]
    table.to_csv(files[0], index=False)
    single.to_csv(files[1], index=False)
    done.to_csv(files[2], index=False)
    for t, frame in views:
        for predictor in ("plasticity_mean", BASELINE):
            if t != "relative_gain" and predictor in frame and frame[predictor].notna().any():
                files.append(plot_score_vs_accuracy(frame, predictor, t, out / f"{predictor}_vs_{t}.png"))
    return TrialAnalysis(table, single, files, len(done))


def _with_comparisons(
    table: pd.DataFrame, frame: pd.DataFrame, n_boot: int, seed: int, min_trials: int
) -> pd.DataFrame:
    """Add each predictor's paired difference against the baseline and its partial Spearman given lr."""
    table = table.copy()
    for column in ("diff_vs_baseline", "diff_low", "diff_high", "partial_spearman", "partial_low", "partial_high"):
        table[column] = math.nan
    table["verdict"] = ""
    lr_varies = "lr" in frame and pd.to_numeric(frame["lr"], errors="coerce").nunique() > 1
    for i, row in table.iterrows():
        if row["note"]:
            continue
        if row["predictor"] != BASELINE:
            c = compare_predictors(frame, row["predictor"], BASELINE, row["target"], n_boot=n_boot, seed=seed)
            table.loc[i, ["diff_vs_baseline", "diff_low", "diff_high", "verdict"]] = [
                c["diff"], c["diff_low"], c["diff_high"], c["verdict"]]
        if lr_varies:
            p = partial_correlations(frame, [row["predictor"]], row["target"], "lr", n_boot=n_boot, seed=seed,
                                     min_trials=min_trials).iloc[0]  # fmt: skip
            table.loc[i, ["partial_spearman", "partial_low", "partial_high"]] = [
                p["partial_spearman"], p["partial_low"], p["partial_high"]]
    return table


TARGET_LABELS = {
    "val_acc": "final validation accuracy, finished trials",
    "relative_gain": "relative gain over the linear probe, finished trials",
    "val_acc_common": "validation accuracy at the last step every trial reached, all trials",
}


CONFOUND_NOTE = ("per-trial correlations mix learning rates and stopping steps: they are confounded by the "
                 "learning rate and by early stopping; the partial Spearman given lr removes the first only")


def describe_correlations(table: pd.DataFrame) -> str:
    """Plain lines per target: each predictor's Spearman with its interval, then plasticity vs the baseline."""
    lines = [f"  ({CONFOUND_NOTE})"] if "partial_spearman" in table and table["partial_spearman"].notna().any() else []
    for target, rows in table.groupby("target", sort=False):
        lines.append(f"  {TARGET_LABELS.get(target, target)}:")
        for row in rows.itertuples():
            if row.note:
                lines.append(f"    {row.predictor:<22} n={row.n}: {row.note}")
                continue
            line = (f"    {row.predictor:<22} Spearman {row.spearman:+.2f} [{row.spearman_low:+.2f}, "
                    f"{row.spearman_high:+.2f}], Kendall {row.kendall:+.2f}, n={row.n}")  # fmt: skip
            if np.isfinite(getattr(row, "partial_spearman", math.nan)):
                line += f"; given lr {row.partial_spearman:+.2f} [{row.partial_low:+.2f}, {row.partial_high:+.2f}]"
            lines.append(line)
        lines += [f"    -> {line}" for line in [_verdict(rows)] if line]
    return "\n".join(lines)


def _verdict(rows: pd.DataFrame) -> str:
    """Does the best plasticity score rank the trials better than log(trainable params)? Paired bootstrap."""
    valid = rows[(rows["note"] == "") & rows["predictor"].isin(SCORES)]
    if valid.empty or "verdict" not in valid or not (valid["verdict"] != "").any():
        return ""
    p = valid.loc[valid["spearman"].idxmax()]
    words = {"better": "ranks these trials better than", "worse": "ranks these trials worse than",
             "no clear difference": "is not clearly different from"}  # fmt: skip
    return (f"{p['predictor']} {words.get(p['verdict'], p['verdict'])} log(trainable parameters): paired bootstrap "
            f"of the Spearman difference {p['diff_vs_baseline']:+.2f} [{p['diff_low']:+.2f}, {p['diff_high']:+.2f}].")


# ----------------------------------------------------------------------------- the criteria lab

LAB_PREDICTORS: tuple[str, ...] = (
    "plasticity_mean", "plasticity_max", "plasticity_weighted", "in_network_mean",
    "grad_norm", "rgn", "rgn_mean", "contains_mha_or_fc", BASELINE,
)  # fmt: skip


def subset_table(trials: pd.DataFrame, predictors: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per subset at its best lr (``best_lr_table`` on test accuracy) with every pre-training predictor beside it.

    Predictors come from the trial table (the first value per subset: plasticity scores, trainable_params ->
    log_trainable_params, contains_mha_or_fc) and from ``predictors`` (indexed by subset name, e.g. criteria).
    """
    select = "best_val_acc" if "best_val_acc" in trials else "val_acc"
    table = best_lr_table(trials, "test_acc", select_by=select).set_index("components")
    names = pd.Series([_config_name(c) for c in trials["components"]], index=trials.index)
    first = trials.groupby(names).first()
    for column in (c for c in LAB_PREDICTORS if c in first):
        table[column] = pd.to_numeric(first[column], errors="coerce").reindex(table.index)
    if "trainable_params" in first:
        table[BASELINE] = np.log(pd.to_numeric(first["trainable_params"], errors="coerce").reindex(table.index))
    table["contains_mha_or_fc"] = [float(bool({"mha", "fc1", "fc2"} & set(parse_subset(c)))) for c in table.index]
    if predictors is not None:
        for column in predictors.columns:
            table[column] = pd.to_numeric(predictors[column], errors="coerce").reindex(table.index)
    return table.rename_axis("components").reset_index()


def criteria_comparison(
    subsets: pd.DataFrame, predictors: list[str] | None = None, target: str = "mean", *, n_boot: int = 2000,
    seed: int = 0, min_trials: int = 5,
) -> pd.DataFrame:  # fmt: skip
    """Each predictor's Spearman and Kendall with ``target`` (BCa 95%), and its paired difference against the baseline.

    One row per predictor present in ``subsets``; the baseline is log(#trainable parameters).
    """
    predictors = [p for p in (predictors or LAB_PREDICTORS) if p in subsets]
    table = correlations(subsets, predictors, target, n_boot=n_boot, seed=seed, min_trials=min_trials)
    table = table.drop(columns=["n_boot", "spearman_p", "kendall_p"])
    for column in ("diff_vs_baseline", "diff_low", "diff_high"):
        table[column] = math.nan
    table["verdict"] = ""
    if BASELINE not in subsets:
        return table
    for i, row in table.iterrows():
        if row["predictor"] != BASELINE and not row["note"]:
            c = compare_predictors(subsets, row["predictor"], BASELINE, target, n_boot=n_boot, seed=seed)
            table.loc[i, ["diff_vs_baseline", "diff_low", "diff_high", "verdict"]] = [
                c["diff"], c["diff_low"], c["diff_high"], c["verdict"]]
    return table


def criteria_winner(comparison: pd.DataFrame) -> str:
    """One sentence: the best predictor that beats log(#trainable parameters), or that none does."""
    better = comparison[comparison["verdict"] == "better"]
    if better.empty:
        return ("No predictor ranks the subsets clearly better than log(#trainable parameters) "
                "(every paired-bootstrap interval of the Spearman difference includes 0 or lies below it).")
    best = better.loc[better["spearman"].idxmax()]
    return (f"{best['predictor']} ranks the subsets best and beats log(#trainable parameters): Spearman "
            f"{best['spearman']:+.2f}, difference {best['diff_vs_baseline']:+.2f} "
            f"[{best['diff_low']:+.2f}, {best['diff_high']:+.2f}].")


def describe_criteria(comparison: pd.DataFrame) -> str:
    """The criteria table as text (Spearman, Kendall with BCa intervals, difference to the baseline) and the winner."""
    lines = ["Which pre-training predictor ranks the subsets (test accuracy at each subset's best lr)? "
             "BCa 95% intervals; difference = Spearman minus that of log(#trainable params), paired bootstrap:"]
    for r in comparison.itertuples():
        if r.note:
            lines.append(f"  {r.predictor:<22} n={r.n}: {r.note}")
            continue
        diff = "" if r.predictor == BASELINE else (
            f"  diff {r.diff_vs_baseline:+.2f} [{r.diff_low:+.2f}, {r.diff_high:+.2f}] {r.verdict}")
        lines.append(f"  {r.predictor:<22} Spearman {r.spearman:+.2f} [{r.spearman_low:+.2f}, {r.spearman_high:+.2f}]"
                     f"  Kendall {r.kendall:+.2f} [{r.kendall_low:+.2f}, {r.kendall_high:+.2f}]{diff}")
    lines.append("  -> " + criteria_winner(comparison))
    return "\n".join(lines)
