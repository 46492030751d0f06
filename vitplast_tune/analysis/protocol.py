"""Apply the paper's protocol: pick each configuration's rate on validation, then compare test gains with plasticity."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vitplast_tune.analysis.correlation import (
    EXACT_BELOW,
    _is_constant,
    _numeric,
    _require_columns,
    _stat_columns,
    point_stats,
)
from vitplast_tune.analysis.plots import _plot_gain_and_plasticity
from vitplast_tune.components import BLOCK_COMPONENTS, HEAD, TABLE_ORDER, subset_name
from vitplast_tune.errors import UserError


def relative_gain(
    acc: float | np.ndarray | pd.Series, baseline_acc: float | np.ndarray | pd.Series
) -> float | np.ndarray | pd.Series:
    """Compute the relative gain over the linear probe, (acc - baseline_acc) / baseline_acc, as in the paper.

    Args:
        acc: The accuracy.
        baseline_acc: The linear probe's accuracy.

    Returns:
        The relative gain, of the inputs' kind.

    Raises:
        UserError: If a baseline accuracy is zero.
    """
    if np.any(np.asarray(baseline_acc, dtype=float) == 0):
        raise UserError("relative gain needs a non-zero baseline accuracy")
    return (acc - baseline_acc) / baseline_acc


def best_lr_table(trials: pd.DataFrame, target: str = "test_acc", *, select_by: str = "best_val_acc") -> pd.DataFrame:
    """Find each configuration's learning rate with the best mean ``select_by`` over seeds, and ``target`` there.

    Args:
        trials: The trial table.
        target: The metric reported at the chosen rate.
        select_by: The metric whose mean over seeds picks the rate.

    Returns:
        One row per configuration, in the paper's order first. It has ``relative_gain`` when the linear probe ran.

    Raises:
        UserError: If the trial table lacks a column it needs.
    """
    _require_columns(trials, ["components", "lr", target, select_by])
    frame = trials.loc[trials["components"].notna(), ["components", "lr"]].copy()
    depths = "depth" in trials
    frame["config"] = [subset_name(c) for c in frame["components"]]
    frame["depth"] = trials.loc[frame.index, "depth"].fillna("all").astype(str) if depths else "all"
    frame["_target"] = _numeric(trials.loc[frame.index, target])
    frame["_select"] = _numeric(trials.loc[frame.index, select_by])
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
    """Return ``best_lr_table``'s rows of the single components, all and head."""
    table = best_lr_table(trials, target, select_by=select_by or target)
    out = table[table["components"].isin(TABLE_ORDER)].reset_index(drop=True)
    out.attrs.update(table.attrs)
    return out


def _component_plasticity(trials: pd.DataFrame, score: str = "plasticity_mean") -> pd.Series:
    """Read each block component's plasticity from its single-component trials."""
    if score not in trials:
        return pd.Series(dtype=float, name=score)
    names = pd.Series([subset_name(c) for c in trials["components"]], index=trials.index)
    values = pd.to_numeric(trials[score], errors="coerce").groupby(names).first()
    return values.reindex([c for c in BLOCK_COMPONENTS if c in values.index]).dropna().rename(score)


def _rank_agreement(table: pd.DataFrame, plasticity: pd.Series, *, value: str | None = None) -> dict[str, Any]:
    """Correlate a per-component ``value`` with plasticity over at least 3 block components, else give NaN."""
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
    out.update(dict.fromkeys(_stat_columns(), math.nan))
    if len(common) >= 3 and not (_is_constant(x) or _is_constant(y)):
        out.update(point_stats(x, y))
    return out


@dataclass
class PaperResults:
    """Hold the paper-style results of a grid with seeds and the files written."""

    table: pd.DataFrame
    agreement: dict[str, Any]
    files: list[Path]


def paper_results(trials: pd.DataFrame, out_dir: str | Path, *, plasticity: pd.Series | None = None) -> PaperResults:
    """Apply the paper's protocol to a grid with seeds and write its table, agreement and figure.

    Args:
        trials: The trial table.
        out_dir: Where the files go. It is made when missing.
        plasticity: The plasticity per component, or None to read it from the single-component trials.

    Returns:
        The per-configuration table, the rank agreement and the files written.
    """
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    select = "best_val_acc" if "best_val_acc" in trials else "val_acc"
    table = best_lr_table(trials, "test_acc", select_by=select)
    plasticity = _component_plasticity(trials) if plasticity is None else plasticity
    agreement = _rank_agreement(table, plasticity)
    files = [out / "paper_table.csv", out / "rank_agreement.csv"]
    table.to_csv(files[0], index=False)
    pd.DataFrame([agreement]).to_csv(files[1], index=False)
    files.append(_plot_gain_and_plasticity(table, plasticity, out / "gain_vs_plasticity.png"))
    return PaperResults(table, agreement, files)


def describe_paper(results: PaperResults) -> str:
    """Describe the paper-style table and the rank agreement as text."""
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
    """Tabulate the gains of several datasets' searches, and each dataset's rank agreement plus a pooled one."""
    gains = pd.DataFrame(
        {name: t.set_index("components")["relative_gain"] for name, t in tables.items() if "relative_gain" in t}
    )
    if gains.empty:
        raise UserError("no search has a linear probe (head) to measure relative gains against")
    order = [c for c in TABLE_ORDER if c in gains.index] + [c for c in gains.index if c not in TABLE_ORDER]
    gains = gains.reindex(order)
    gains["mean_gain"] = gains.mean(axis=1)
    rows = [
        {"dataset": name, **_rank_agreement(tables[name], plasticity.get(name, pd.Series(dtype=float)))}
        for name in gains.columns[:-1]
    ]
    pooled_plasticity = pd.concat([plasticity[n] for n in gains.columns[:-1] if n in plasticity], axis=1).mean(axis=1)
    pooled = gains["mean_gain"].rename("mean").rename_axis("components").reset_index()
    rows.append({"dataset": "pooled", **_rank_agreement(pooled, pooled_plasticity, value="mean")})
    return gains.rename_axis("components").reset_index(), pd.DataFrame(rows)


def cross_dataset_report(
    trials: dict[str, pd.DataFrame], out_dir: str | Path
) -> tuple[pd.DataFrame, pd.DataFrame, list[Path]]:
    """Compare several searches' trial tables, one per dataset, and write the tables as CSV.

    Args:
        trials: The trial tables, by dataset.
        out_dir: Where the CSV files go. It is made when missing.

    Returns:
        The gains per configuration and dataset, the rank agreement per dataset, and the files written.
    """
    select = {name: "best_val_acc" if "best_val_acc" in t else "val_acc" for name, t in trials.items()}
    tables = {name: best_lr_table(t, "test_acc", select_by=select[name]) for name, t in trials.items()}
    gains, agreement = cross_dataset(tables, {name: _component_plasticity(t) for name, t in trials.items()})
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "cross_dataset_gains.csv", out / "cross_dataset_agreement.csv"]
    gains.to_csv(files[0], index=False)
    agreement.to_csv(files[1], index=False)
    return gains, agreement, files


def describe_cross_dataset(gains: pd.DataFrame, agreement: pd.DataFrame) -> str:
    """Describe the cross-dataset gains and rank agreement as text."""
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
