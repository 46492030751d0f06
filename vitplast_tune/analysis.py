"""Pure analysis of finished trials and plasticity tables: correlations, relative gains, tables, plots.

Every function takes pandas objects and returns pandas objects (or writes one PNG); nothing here
needs Ray or MLflow. Plots draw on ``matplotlib.figure.Figure`` directly (Agg rendering), so
importing this module never selects a pyplot backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """Spearman and Kendall correlation of each predictor column with ``target``, with seeded bootstrap 95% intervals.

    One row per predictor; ``n`` counts the trials where both are finite. With fewer than
    ``min_trials`` (or a constant column) the statistics are NaN and ``note`` says why.
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
            boot = _bootstrap(x, y, n_boot, np.random.default_rng(seed))
            row["n_boot"] = len(boot)
            if len(boot):
                for i, s in enumerate(_STATS):
                    row[f"{s}_low"], row[f"{s}_high"] = np.percentile(boot[:, i], [2.5, 97.5])
            elif n_boot > 0:
                row["note"] = "every bootstrap resample was degenerate"
        rows.append(row)
    return pd.DataFrame(rows, columns=["predictor", "target", "n", *_stat_columns(), "n_boot", "note"])


def relative_gain(acc, baseline_acc):
    """Relative gain over the linear probe, (acc - baseline_acc) / baseline_acc, as in the paper.

    Works on floats, numpy arrays and pandas Series alike; raises UserError for a zero baseline.
    """
    if np.any(np.asarray(baseline_acc, dtype=float) == 0):
        raise UserError("relative gain needs a non-zero baseline accuracy")
    return (acc - baseline_acc) / baseline_acc


def single_component_table(
    trials: pd.DataFrame, target: str = "val_acc", *, select_by: str | None = None
) -> pd.DataFrame:
    """Per configuration (mha, fc1, fc2, ln2, ln1, emb, all, head): best lr, mean and std over seeds at that lr.

    The best lr maximises the mean over seeds of ``select_by`` (default: ``target``); multi-component
    subsets are left out. When the linear probe ("head") is present, ``relative_gain`` compares each
    configuration's mean with it.
    """
    select_by = select_by or target
    _require_columns(trials, ["components", "lr", target, select_by])
    columns = list(dict.fromkeys(["components", "lr", target, select_by]))
    frame = trials.loc[trials["components"].notna(), columns].copy()
    frame["config"] = [_config_name(c) for c in frame["components"]]
    frame["_target"], frame["_select"] = _numeric(frame[target]), _numeric(frame[select_by])
    frame = frame[np.isfinite(frame["_target"]) & np.isfinite(frame["_select"]) & frame["config"].isin(TABLE_ORDER)]
    rows = []
    for config in [c for c in TABLE_ORDER if c in set(frame["config"])]:
        runs = frame[frame["config"] == config]
        by_lr = runs.groupby("lr")
        best_lr = by_lr["_select"].mean().idxmax()
        at_best = runs.loc[runs["lr"] == best_lr, "_target"]
        rows.append(
            {"components": config, "lr": best_lr, "mean": at_best.mean(), "std": at_best.std(ddof=1),
             "n_seeds": len(at_best), "n_lrs": by_lr.ngroups, "n_runs": len(runs)}
        )  # fmt: skip
    table = pd.DataFrame(rows, columns=["components", "lr", "mean", "std", "n_seeds", "n_lrs", "n_runs"])
    head = table.loc[table["components"] == HEAD, "mean"]
    if len(head) and head.iloc[0] != 0:
        table["relative_gain"] = relative_gain(table["mean"], head.iloc[0])
    table.attrs.update(target=target, select_by=select_by)
    return table


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


def _bootstrap(x: np.ndarray, y: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples, 2) Spearman and Kendall over resamples of the trials; degenerate resamples are skipped."""
    out = []
    for idx in rng.integers(0, len(x), size=(n_boot, len(x))):
        xb, yb = x[idx], y[idx]
        if _constant(xb) or _constant(yb):
            continue
        out.append((stats.spearmanr(xb, yb).statistic, stats.kendalltau(xb, yb).statistic))
    return np.array(out, dtype=float).reshape(-1, 2)


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
    probe when the search has head-only trials. Writes correlations.csv, single_components.csv and
    scatter plots to ``out_dir``.
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
        [correlations(frame, predictors, t, n_boot=n_boot, seed=seed, min_trials=min_trials) for t, frame in views],
        ignore_index=True,
    )
    files = [out / "correlations.csv", out / "single_components.csv", out / "finished_trials.csv"]
    table.to_csv(files[0], index=False)
    single.to_csv(files[1], index=False)
    done.to_csv(files[2], index=False)
    for t, frame in views:
        for predictor in ("plasticity_mean", BASELINE):
            if t != "relative_gain" and predictor in frame and frame[predictor].notna().any():
                files.append(plot_score_vs_accuracy(frame, predictor, t, out / f"{predictor}_vs_{t}.png"))
    return TrialAnalysis(table, single, files, len(done))


TARGET_LABELS = {
    "val_acc": "final validation accuracy, finished trials",
    "relative_gain": "relative gain over the linear probe, finished trials",
    "val_acc_common": "validation accuracy at the last step every trial reached, all trials",
}


def describe_correlations(table: pd.DataFrame) -> str:
    """Plain lines per target: each predictor's Spearman with its interval, then plasticity vs the baseline."""
    lines = []
    for target, rows in table.groupby("target", sort=False):
        lines.append(f"  {TARGET_LABELS.get(target, target)}:")
        for row in rows.itertuples():
            if row.note:
                lines.append(f"    {row.predictor:<22} n={row.n}: {row.note}")
            else:
                lines.append(f"    {row.predictor:<22} Spearman {row.spearman:+.2f} [{row.spearman_low:+.2f}, "
                             f"{row.spearman_high:+.2f}], Kendall {row.kendall:+.2f}, n={row.n}")  # fmt: skip
        lines += [f"    -> {line}" for line in [_verdict(rows)] if line]
    return "\n".join(lines)


def _verdict(rows: pd.DataFrame) -> str:
    """Which ranks the trials better, the best plasticity score or log(trainable parameters), and how clearly."""
    valid = rows[rows["note"] == ""]
    plastic, baseline = valid[valid["predictor"].isin(SCORES)], valid[valid["predictor"] == BASELINE]
    if plastic.empty or baseline.empty:
        return ""
    p, b = plastic.loc[plastic["spearman"].idxmax()], baseline.iloc[0]
    winner, loser = (p, b) if p.spearman > b.spearman else (b, p)
    clear = winner.spearman_low > loser.spearman_high
    name = lambda r: "log(trainable parameters)" if r.predictor == BASELINE else r.predictor  # noqa: E731
    return (f"{name(winner)} ranks these trials better than {name(loser)} "
            f"({winner.spearman:+.2f} vs {loser.spearman:+.2f}; "
            f"{'the intervals do not overlap' if clear else 'the intervals overlap: not a clear difference'}).")  # fmt: skip
