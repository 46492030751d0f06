"""The paper's protocol on a trial table: the learning rate chosen on mean validation accuracy over
seeds, test accuracy there, the relative gain over the linear probe, its rank agreement with
plasticity per component, and the same across datasets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vitplast_tune.analysis.correlation import (
    EXACT_BELOW,
    is_constant,
    numeric,
    point_stats,
    require_columns,
    stat_columns,
)
from vitplast_tune.analysis.plots import plot_gain_and_plasticity
from vitplast_tune.components import BLOCK_COMPONENTS, HEAD, TABLE_ORDER, subset_name
from vitplast_tune.errors import UserError


def relative_gain(
    acc: float | np.ndarray | pd.Series, baseline_acc: float | np.ndarray | pd.Series
) -> float | np.ndarray | pd.Series:
    """Compute the relative gain over the linear probe, (acc - baseline_acc) / baseline_acc, as in the paper.

    Works on floats, numpy arrays and pandas Series alike.

    Args:
        acc: The accuracy.
        baseline_acc: The linear probe's accuracy.

    Returns:
        The relative gain, of the inputs' kind.

    Raises:
        UserError: A baseline accuracy is zero.
    """
    if np.any(np.asarray(baseline_acc, dtype=float) == 0):
        raise UserError("relative gain needs a non-zero baseline accuracy")
    return (acc - baseline_acc) / baseline_acc


def best_lr_table(trials: pd.DataFrame, target: str = "test_acc", *, select_by: str = "best_val_acc") -> pd.DataFrame:
    """Find each configuration's learning rate with the best mean ``select_by`` over seeds, and ``target`` there.

    A configuration is any subset and its methods, and its depth when the trials have one.

    Args:
        trials: The trial table.
        target: The metric reported at the chosen rate.
        select_by: The metric the rate is chosen by (its mean over seeds).

    Returns:
        Columns components, depth (when the trials have one), lr, mean, std (over seeds, ddof=1), n_seeds, n_lrs,
        n_runs, and relative_gain ((mean - probe) / probe, as in the paper) when the linear probe ("head") is present.
        Configurations come in the paper's order (TABLE_ORDER) first, then the others in order of appearance.

    Raises:
        UserError: The trial table lacks a column it needs.
    """
    require_columns(trials, ["components", "lr", target, select_by])
    frame = trials.loc[trials["components"].notna(), ["components", "lr"]].copy()
    depths = "depth" in trials
    frame["config"] = [subset_name(c) for c in frame["components"]]
    frame["depth"] = trials.loc[frame.index, "depth"].fillna("all").astype(str) if depths else "all"
    frame["_target"] = numeric(trials.loc[frame.index, target])
    frame["_select"] = numeric(trials.loc[frame.index, select_by])
    frame = frame[np.isfinite(frame["_target"]) & np.isfinite(frame["_select"])]
    seen = list(dict.fromkeys(zip(frame["config"], frame["depth"])))
    rows = []
    known = sorted((k for k in seen if k[0] in TABLE_ORDER), key=lambda k: TABLE_ORDER.index(k[0]))
    for config, depth in known + [k for k in seen if k[0] not in TABLE_ORDER]:
        runs = frame[(frame["config"] == config) & (frame["depth"] == depth)]
        by_lr = runs.groupby("lr")
        best_lr = by_lr["_select"].mean().idxmax()
        at_best = runs.loc[runs["lr"] == best_lr, "_target"]
        rows.append(
            {
                "components": config,
                **({"depth": depth} if depths else {}),
                "lr": best_lr,
                "mean": at_best.mean(),
                "std": at_best.std(ddof=1),
                "n_seeds": len(at_best),
                "n_lrs": by_lr.ngroups,
                "n_runs": len(runs),
            }
        )
    columns = ["components", *(["depth"] if depths else []), "lr", "mean", "std", "n_seeds", "n_lrs", "n_runs"]
    table = pd.DataFrame(rows, columns=columns)
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
    names = pd.Series([subset_name(c) for c in trials["components"]], index=trials.index)
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
    out: dict[str, Any] = {
        "value": value,
        "n": len(common),
        "components": "+".join(common),
        "by_value": " > ".join(gains[common].sort_values(ascending=False).index),
        "by_plasticity": " > ".join(plasticity[common].sort_values(ascending=False).index),
    }
    out.update(dict.fromkeys(stat_columns(), math.nan))
    if len(common) >= 3 and not (is_constant(x) or is_constant(y)):
        out.update(point_stats(x, y))
    return out


@dataclass
class PaperResults:
    """The paper-style results of a grid with seeds: per-configuration table, rank agreement, files."""

    table: pd.DataFrame
    agreement: dict[str, Any]
    files: list[Path]


def paper_results(trials: pd.DataFrame, out_dir: str | Path, *, plasticity: pd.Series | None = None) -> PaperResults:
    """Apply the paper's protocol to a trial table: best lr on validation (mean over seeds), test accuracy there, gains.

    Writes paper_table.csv, rank_agreement.csv and gain_vs_plasticity.png to ``out_dir``.

    Args:
        trials: The trial table (a grid with seeds).
        out_dir: Where the files go (made when missing).
        plasticity: The plasticity per component (None: the single-component trials' ``plasticity_mean``).

    Returns:
        The per-configuration table, the rank agreement and the files written.
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
    shown = pd.DataFrame(
        {
            "components": t["components"],
            "best lr": t["lr"].map(lambda v: f"{v:.3g}"),
            "test acc": [
                f"{100 * m:.2f} ± {100 * s:.2f}%" if np.isfinite(s) else f"{100 * m:.2f}%"
                for m, s in zip(t["mean"], t["std"])
            ],
            "seeds": t["n_seeds"],
        }
    )
    if "relative_gain" in t:
        shown["gain vs probe"] = t["relative_gain"].map(lambda g: f"{100 * g:+.2f}%")
    a = results.agreement
    lines = [
        "Paper protocol: lr chosen on mean validation accuracy over seeds; test accuracy there (mean ± std):",
        shown.to_string(index=False),
    ]
    if a["n"] >= 3 and np.isfinite(a["spearman"]):
        lines.append(f"  ranked by {a['value']}: {a['by_value']};  by plasticity: {a['by_plasticity']}")
        kind = "exact permutation p" if a["n"] < EXACT_BELOW else "p"
        lines.append(
            f"  agreement over {a['n']} components: Spearman {a['spearman']:+.2f} ({kind}={a['spearman_p']:.2g}), "
            f"Kendall {a['kendall']:+.2f} ({kind}={a['kendall_p']:.2g}); unadjusted figures, not a verdict"
        )
    return "\n".join(lines)


def cross_dataset(
    tables: dict[str, pd.DataFrame], plasticity: dict[str, pd.Series]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Several searches (one per dataset) together: relative gain per component and dataset, and its mean.

    Returns (gains: one row per configuration, a column per dataset and ``mean_gain``; agreement: one row
    per dataset and a "pooled" row, mean gain vs mean plasticity over datasets, with Spearman and Kendall).
    """
    gains = pd.DataFrame(
        {name: t.set_index("components")["relative_gain"] for name, t in tables.items() if "relative_gain" in t}
    )
    if gains.empty:
        raise UserError("no search has a linear probe (head) to measure relative gains against")
    order = [c for c in TABLE_ORDER if c in gains.index] + [c for c in gains.index if c not in TABLE_ORDER]
    gains = gains.reindex(order)
    gains["mean_gain"] = gains.mean(axis=1)
    rows = [
        {"dataset": name, **rank_agreement(tables[name], plasticity.get(name, pd.Series(dtype=float)))}
        for name in gains.columns[:-1]
    ]
    pooled_plasticity = pd.concat([plasticity[n] for n in gains.columns[:-1] if n in plasticity], axis=1).mean(axis=1)
    pooled = gains["mean_gain"].rename("mean").rename_axis("components").reset_index()
    rows.append({"dataset": "pooled", **rank_agreement(pooled, pooled_plasticity, value="mean")})
    return gains.rename_axis("components").reset_index(), pd.DataFrame(rows)


def cross_dataset_report(
    trials: dict[str, pd.DataFrame], out_dir: str | Path
) -> tuple[pd.DataFrame, pd.DataFrame, list[Path]]:
    """Compare several searches' trial tables, one per dataset (``cross_dataset``), and write the tables as CSV.

    Args:
        trials: The trial tables, by dataset.
        out_dir: Where the CSV files go (made when missing).

    Returns:
        The gains (one row per configuration, a column per dataset and ``mean_gain``), the rank agreement (one row per
        dataset and a "pooled" row) and the files written.
    """
    select = {name: "best_val_acc" if "best_val_acc" in t else "val_acc" for name, t in trials.items()}
    tables = {name: best_lr_table(t, "test_acc", select_by=select[name]) for name, t in trials.items()}
    gains, agreement = cross_dataset(tables, {name: component_plasticity(t) for name, t in trials.items()})
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "cross_dataset_gains.csv", out / "cross_dataset_agreement.csv"]
    gains.to_csv(files[0], index=False)
    agreement.to_csv(files[1], index=False)
    return gains, agreement, files


def describe_cross_dataset(gains: pd.DataFrame, agreement: pd.DataFrame) -> str:
    """The cross-dataset table as text: relative gain per configuration and dataset, then the rank agreement."""
    shown = agreement[["dataset", "n", "by_value", "by_plasticity", "spearman", "kendall"]]
    with pd.option_context("display.width", 160):
        return "\n".join(
            [
                "Relative gain over the linear probe per configuration and dataset (test accuracy, best lr):",
                gains.to_string(index=False, float_format=lambda v: f"{100 * v:+.2f}%"),
                "",
                "Rank agreement of the gain with plasticity:",
                shown.to_string(index=False),
            ]
        )
