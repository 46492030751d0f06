"""Draw a forest plot per predictor of the pooled verdict: a row per lab and diamonds per model and overall."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vitplast_tune.analysis.multiple import percentile_interval
from vitplast_tune.lab.analysis import SUBSETS
from vitplast_tune.lab.pooled import BASELINE_WORDS, PooledResult


def _pooled_interval(result: PooledResult, predictor: str, what: str, model: str | None) -> tuple[float, float, float]:
    """Return the mean difference over the labs of ``model``, or all, and its 95% interval from pooled resamples."""
    found = [a.difference(predictor, what) for a in result.labs if model is None or a.records.model == model]
    found = [d for d in found if d is not None and d.samples is not None]
    if not found:
        return np.nan, np.nan, np.nan
    low, high = percentile_interval(np.vstack([d.samples for d in found]).mean(axis=0), 0.95)
    return float(np.mean([d.estimate for d in found])), low, high


def _diamond(ax, y: float, mid: float, low: float, high: float, color: str) -> None:
    ax.fill([low, mid, high, mid], [y, y + 0.3, y, y - 0.3], color=color, alpha=0.8)


def _forest_plot(result: PooledResult, predictor: str, what: str, path: Path) -> Path:
    """Write one predictor's forest plot as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.per_lab[(result.per_lab["predictor"] == predictor) & (result.per_lab["what"] == what)]
    rows = rows.sort_values(["model", "task"], kind="stable")
    models = list(dict.fromkeys(rows["model"]))
    height = len(rows) + len(models) + 2
    short = {v: k for k, v in result.design.models.items()}
    fig, ax = plt.subplots(figsize=(9.5, 0.42 * height + 1.4))
    labels, y = [], height
    for r in rows.itertuples():
        y -= 1
        ax.errorbar(r.diff, y, xerr=[[r.diff - r.low], [r.high - r.diff]], fmt="s", color="black", capsize=3)
        labels.append((y, f"{short.get(r.model, r.model)} {r.task}"))
    for model in models:
        y -= 1
        _diamond(ax, y, *_pooled_interval(result, predictor, what, model), color="tab:blue")
        labels.append((y, f"{short.get(model, model)}: mean over its labs"))
    y -= 1
    _diamond(ax, y, *_pooled_interval(result, predictor, what, None), color="tab:red")
    labels.append((y, f"all {len(rows)} labs: mean"))
    head = result.headline[(result.headline["predictor"] == predictor) & (result.headline["what"] == what)]
    if len(head) and np.isfinite(head["re"].iloc[0]):
        y -= 1
        h = head.iloc[0]
        _diamond(ax, y, h["re"], h["re_low"], h["re_high"], color="tab:green")
        labels.append((y, f"random effects (tau^2 {h['tau2']:.3g}, I^2 {100 * h['i2']:.0f}%)"))
    margin = result.design.margin
    ax.axvline(0, color="grey", lw=1)
    for edge in (-margin, margin):
        ax.axvline(edge, color="grey", lw=1, ls="--")
    ax.set_yticks([p for p, _ in labels], [t for _, t in labels])
    ax.set_ylim(y - 1, height)
    rows_said = "the subsets" if what == SUBSETS else "the single block components"
    ax.set_xlabel(
        f"Spearman({predictor}) - Spearman({BASELINE_WORDS}) on {rows_said}\n(95% intervals; dashed: margin ±{margin:g})"
    )
    ax.set_title(f"{predictor} against the parameter count")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def forest_plots(result: PooledResult, folder: Path) -> list[Path]:
    """Write a forest plot for each predictor and kind of rows that the family judges.

    Args:
        result: The pooled verdict.
        folder: Where to write them.

    Returns:
        Their paths.
    """
    wanted = dict.fromkeys(
        (j.claim.predictor, "single components" if j.claim.claim == "narrower" else SUBSETS) for j in result.judged
    )
    paths = []
    for predictor, what in wanted:
        stem = predictor if what == SUBSETS else f"{predictor}-single"
        paths.append(_forest_plot(result, predictor, what, Path(folder) / f"forest-{stem}.png"))
    return paths
