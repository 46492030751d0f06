"""Draw the analyses' PNG figures on plain matplotlib figures, so no pyplot backend is ever selected."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from vitplast_tune.analysis.correlation import _is_constant, _numeric, _require_columns
from vitplast_tune.components import BLOCK_COMPONENTS, HEAD, TABLE_ORDER


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
    rho = stats.spearmanr(xs, ys).statistic if n >= 2 and not (_is_constant(xs) or _is_constant(ys)) else math.nan
    ax.set_title(f"Spearman ρ = {rho:.3f} (n = {n})" if np.isfinite(rho) else f"Spearman ρ undefined (n = {n})")
    return _save(fig, path)


def _plot_gain_and_plasticity(table: pd.DataFrame, plasticity: pd.Series, path: str | Path) -> Path:
    """Write a PNG like the paper's figure, with each configuration's gain beside each component's plasticity."""
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


def plot_pareto(
    trials: pd.DataFrame, front: pd.DataFrame, cost: str, path: str | Path, accuracy: str = "best_val_acc"
) -> Path:
    """Write a PNG of every trial's ``accuracy`` against ``cost``, with the front as a labelled step line."""
    fig, (ax,) = _figure(ncols=1, figsize=(7, 4.8))
    x, y = _numeric(trials[cost]), _numeric(trials[accuracy])
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0)
    ax.scatter(x[keep], 100 * y[keep], color="0.7", edgecolors="k", linewidths=0.3, label="trials")
    fx, fy = _numeric(front[cost]), 100 * _numeric(front[accuracy])
    ax.step(fx, fy, where="post" if cost == "trainable_params" else "pre", color="C3", marker="o", label="Pareto front")
    for xi, yi, name in zip(fx, fy, front["components"]):
        ax.annotate(str(name), (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("trainable parameters" if cost == "trainable_params" else "training images/s")
    ax.set_ylabel(f"{accuracy} (%)")
    ax.legend(frameon=False, loc="lower right")
    return _save(fig, path)


def _plot_importance(table: pd.DataFrame, title: str, path: str | Path) -> Path:
    """Write a PNG with a bar per parameter's importance, green when it raises accuracy and red when it lowers it."""
    fig, (ax,) = _figure(ncols=1, figsize=(7, 0.45 * max(len(table), 3) + 1.2))
    shown = table.iloc[::-1]
    y = np.arange(len(shown))
    effect = _numeric(shown["effect"])
    colors = ["0.6" if not np.isfinite(e) or e == 0 else ("C2" if e > 0 else "C3") for e in effect]
    ax.barh(y, _numeric(shown["importance"]), color=colors)
    ax.set_yticks(y, shown["parameter"])
    for yi, (importance, e, kind) in enumerate(zip(shown["importance"], effect, shown["effect_kind"])):
        text = "" if not np.isfinite(e) else (f"ρ {e:+.2f}" if kind == "spearman" else f"{100 * e:+.1f} pts")
        ax.annotate(text, (importance, yi), textcoords="offset points", xytext=(4, -3), fontsize=8)
    ax.set_xlabel("fANOVA importance (share of the variance)")
    ax.set_title(title, fontsize=9)
    ax.set_xlim(0, max(1.0, float(_numeric(table["importance"]).max() or 0) * 1.25))
    return _save(fig, path)


def _figure(ncols: int, figsize: tuple[float, float]):
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, list(np.atleast_1d(fig.subplots(1, ncols)))


def _save(fig, path: str | Path) -> Path:
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")
    return path
