"""Where to finetune: depth as a dimension of a search. Per configuration (a subset with its methods, at a depth) at
its best learning rate, does the plasticity of the layers it trains predict its test accuracy, beside the naive
baseline log(#trainable parameters)? Within each subset, is its most plastic depth its best one? With the
plasticity per component and layer beside the answer.

Pure functions on pandas objects: the trials' ``plasticity_mean`` is already the mean over the layers each trial
trains (``predictors.report.Predictors.trial_scores``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from vitplast_tune.analysis.correlation import is_constant, point_stats
from vitplast_tune.analysis.lab import criteria_comparison, describe_criteria
from vitplast_tune.analysis.protocol import best_lr_table
from vitplast_tune.components import subset_name
from vitplast_tune.predictors.scores import BASELINE, log_trainable_params

DEPTH_PREDICTORS: tuple[str, ...] = ("plasticity_mean", "plasticity_max", BASELINE)


@dataclass
class DepthAnalysis:
    """The depth analysis of a search whose trials vary their depth, and the files written."""

    table: pd.DataFrame  # per (components, depth) at its best lr: test accuracy and the predictors
    agreement: pd.DataFrame  # per subset: its best depth by accuracy and its most plastic depth
    comparison: pd.DataFrame | None = None  # each predictor's rank correlation with accuracy over configurations
    layers: pd.DataFrame | None = None  # plasticity per block component (rows) and layer (columns)
    files: list[Path] = field(default_factory=list)


def varies_depth(trials: pd.DataFrame) -> bool:
    """Whether a trial table's trials train at more than one depth."""
    return "depth" in trials and trials["depth"].fillna("all").nunique() > 1


def depth_table(trials: pd.DataFrame) -> pd.DataFrame:
    """Per (components, depth) at its best lr (mean validation accuracy over seeds): test accuracy there (mean, std,
    seeds), the plasticity of the layers it trains (mean and max) and log(#trainable parameters)."""
    select = "best_val_acc" if "best_val_acc" in trials else "val_acc"
    table = best_lr_table(trials, "test_acc", select_by=select)
    keys = pd.MultiIndex.from_arrays(
        [[subset_name(c) for c in trials["components"]], trials["depth"].fillna("all").astype(str)]
    )
    first = trials.set_axis(keys).groupby(level=[0, 1]).first()
    at = pd.MultiIndex.from_arrays([table["components"], table["depth"]])
    for column in ("plasticity_mean", "plasticity_max", "trainable_params"):
        if column in first:
            table[column] = pd.to_numeric(first[column], errors="coerce").reindex(at).to_numpy()
    if "trainable_params" in table:
        table[BASELINE] = log_trainable_params(table["trainable_params"])
    return table


def depth_agreement(table: pd.DataFrame) -> pd.DataFrame:
    """Per subset trained at two or more depths: its depths by accuracy and by plasticity, whether its best depth is
    its most plastic one, and the Spearman between the two over its depths (three or more)."""
    rows = []
    for components, runs in table.groupby("components", sort=False):
        runs = runs.dropna(subset=["mean"])
        if len(runs) < 2 or "plasticity_mean" not in runs or runs["plasticity_mean"].isna().any():
            continue
        by_acc = runs.sort_values("mean", ascending=False)
        by_plasticity = runs.sort_values("plasticity_mean", ascending=False)
        x, y = runs["plasticity_mean"].to_numpy(float), runs["mean"].to_numpy(float)
        rho = point_stats(x, y)["spearman"] if len(runs) >= 3 and not (is_constant(x) or is_constant(y)) else math.nan
        rows.append(
            {
                "components": components,
                "depths": len(runs),
                "by_accuracy": " > ".join(by_acc["depth"]),
                "by_plasticity": " > ".join(by_plasticity["depth"]),
                "best_depth": by_acc["depth"].iloc[0],
                "most_plastic_depth": by_plasticity["depth"].iloc[0],
                "agree": by_acc["depth"].iloc[0] == by_plasticity["depth"].iloc[0],
                "spearman": rho,
            }
        )
    columns = ["components", "depths", "by_accuracy", "by_plasticity", "best_depth", "most_plastic_depth"]
    return pd.DataFrame(rows, columns=[*columns, "agree", "spearman"])


def analyze_depth(
    trials: pd.DataFrame, out_dir: str | Path, *, layers: pd.DataFrame | None = None, n_boot: int = 2000
) -> DepthAnalysis:
    """The depth analysis of a trial table (``depth_table``, ``depth_agreement``, and over every configuration each
    predictor's Spearman with test accuracy against the baseline's); written as CSV into ``out_dir``."""
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    table = depth_table(trials)
    found = DepthAnalysis(table, depth_agreement(table), layers=layers)
    if any(p in table for p in DEPTH_PREDICTORS[:-1]) and BASELINE in table:
        found.comparison = criteria_comparison(table, list(DEPTH_PREDICTORS), n_boot=n_boot)
    found.files = [out / "depth_table.csv", out / "depth_agreement.csv"]
    table.to_csv(found.files[0], index=False)
    found.agreement.to_csv(found.files[1], index=False)
    if found.comparison is not None:
        found.files.append(out / "depth_criteria.csv")
        found.comparison.to_csv(found.files[-1], index=False)
    if layers is not None:
        found.files.append(out / "plasticity_per_layer.csv")
        layers.to_csv(found.files[-1])
    return found


def describe_depth(found: DepthAnalysis) -> str:
    """The depth analysis as text: plasticity per layer, accuracy per subset and depth, and the verdicts."""
    lines = []
    if found.layers is not None:
        lines += [
            "Plasticity per component (rows) and layer (columns: block index):",
            found.layers.to_string(float_format=lambda v: f"{v:.3g}"),
            "",
        ]
    t = found.table
    shown = pd.DataFrame(
        {
            "components": t["components"],
            "depth": t["depth"],
            "best lr": t["lr"].map(lambda v: f"{v:.3g}"),
            "test acc": [_mean_std(m, s) for m, s in zip(t["mean"], t["std"])],
            "seeds": t["n_seeds"],
        }
    )
    if "plasticity_mean" in t:
        shown["plasticity of its layers"] = t["plasticity_mean"].map(lambda v: "" if pd.isna(v) else f"{v:.3g}")
    if "trainable_params" in t:
        shown["trainable"] = t["trainable_params"].map(lambda v: "" if pd.isna(v) else f"{int(v):,}")
    lines += ["Where to finetune: each subset at each depth, test accuracy at its best lr (mean ± std over seeds):"]
    lines += [shown.to_string(index=False)]
    lines += _agreement_lines(found.agreement)
    if found.comparison is not None:
        lines += ["", describe_criteria(found.comparison, "configurations (subset x depth)")]
    return "\n".join(lines)


def _agreement_lines(agreement: pd.DataFrame) -> list[str]:
    """Per subset, its best and most plastic depths; and how often they were the same, against chance."""
    if agreement.empty:
        return []
    lines = ["", "Is a subset's most plastic depth its best one?"]
    for r in agreement.itertuples():
        rho = "" if not np.isfinite(r.spearman) else f", Spearman over depths {r.spearman:+.2f}"
        lines.append(
            f"  {r.components:<24} best {r.best_depth:<7} most plastic {r.most_plastic_depth:<7} "
            f"{'yes' if r.agree else 'no '}  (by accuracy {r.by_accuracy}{rho})"
        )
    chance = float(np.mean(1.0 / agreement["depths"]))
    lines.append(
        f"  -> the most plastic depth was the best one for {int(agreement['agree'].sum())} of {len(agreement)} "
        f"subsets (by chance: {chance * len(agreement):.1f} of {len(agreement)})."
    )
    return lines


def _mean_std(mean: float, std: float) -> str:
    return f"{100 * mean:.2f} ± {100 * std:.2f}%" if np.isfinite(std) else f"{100 * mean:.2f}%"
