"""Analyze where to finetune when a search varies the depth: does plasticity find the best depth and configuration?"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from vitplast_tune.analysis import multiple
from vitplast_tune.analysis.correlation import MIN_POINTS, _is_constant, spearman
from vitplast_tune.analysis.protocol import best_lr_table
from vitplast_tune.analysis.resampling import runs_of
from vitplast_tune.analysis.subsets import (
    N_BOOT,
    Statistics,
    _comparison_frame,
    _fill_verdicts,
    _predictor_statistics,
)
from vitplast_tune.analysis.subsets_report import _comparison_line, _mean_std
from vitplast_tune.analysis.verdicts import CORRECTIONS, corrected_p, family_clause
from vitplast_tune.components import depth_blocks, subset_name
from vitplast_tune.predictors.scores import BASELINE, log_trainable_params

DEPTH_PREDICTORS: tuple[str, ...] = ("in_network_mean", "plasticity_mean", "plasticity_max", BASELINE)


@dataclass
class DepthAnalysis:
    """Hold the depth analysis of a search whose trials vary their depth, and the files written."""

    table: pd.DataFrame  # each configuration at its best lr, with test accuracy and the predictors
    agreement: pd.DataFrame  # each subset's best depth and its most plastic depth
    score: str = "plasticity_mean"  # the agreement uses this per-layer score
    test: dict = field(default_factory=dict)  # the count of agreements against chance
    comparison: pd.DataFrame | None = None  # each predictor's rank correlation with accuracy
    layers: pd.DataFrame | None = None  # plasticity per component and layer
    files: list[Path] = field(default_factory=list)
    family: int = 0
    alpha: float = multiple.ALPHA


def varies_depth(trials: pd.DataFrame) -> bool:
    """Return whether the trials train at more than one depth."""
    return "depth" in trials and trials["depth"].fillna("all").nunique() > 1


def depth_table(trials: pd.DataFrame, predictors: pd.DataFrame | None = None) -> pd.DataFrame:
    """Tabulate each (components, depth) at its best lr with its test accuracy, plasticity and parameter count."""
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
    if predictors is not None:
        for column in predictors.columns:
            table[column] = pd.to_numeric(predictors[column], errors="coerce").reindex(at).to_numpy()
    if "trainable_params" in table:
        table[BASELINE] = log_trainable_params(table["trainable_params"])
    return table


def comparable_depths(depths: list[str], num_blocks: int) -> list[str]:
    """Keep the depths whose blocks contain no other depth's blocks, since only those can be the most plastic."""
    blocks = {d: set(depth_blocks(d, num_blocks) or range(num_blocks)) for d in depths}
    return [d for d in depths if not any(o != d and blocks[o] < blocks[d] for o in depths)]


def depth_agreement(table: pd.DataFrame, score: str, num_blocks: int) -> pd.DataFrame:
    """Order each subset's comparable depths by accuracy and by ``score``, and say whether the two firsts agree."""
    rows = []
    for components, runs in table.groupby("components", sort=False) if score in table and num_blocks else []:
        runs = runs.dropna(subset=["mean"])
        runs = runs[runs["depth"].isin(comparable_depths(list(runs["depth"]), num_blocks))]
        if len(runs) < 2 or score not in runs or runs[score].isna().any():
            continue
        by_acc = runs.sort_values("mean", ascending=False)
        by_score = runs.sort_values(score, ascending=False)
        x, y = runs[score].to_numpy(float), runs["mean"].to_numpy(float)
        rho = spearman(x, y) if len(runs) >= 3 and not (_is_constant(x) or _is_constant(y)) else math.nan
        rows.append(
            {
                "components": components,
                "depths": len(runs),
                "by_accuracy": " > ".join(by_acc["depth"]),
                "by_plasticity": " > ".join(by_score["depth"]),
                "best_depth": by_acc["depth"].iloc[0],
                "most_plastic_depth": by_score["depth"].iloc[0],
                "agree": by_acc["depth"].iloc[0] == by_score["depth"].iloc[0],
                "chance": 1.0 / len(runs),
                "spearman": rho,
            }
        )
    columns = ["components", "depths", "by_accuracy", "by_plasticity", "best_depth", "most_plastic_depth"]
    return pd.DataFrame(rows, columns=[*columns, "agree", "chance", "spearman"])


def agreement_test(agreement: pd.DataFrame) -> dict:
    """Test the count of agreements exactly against its Poisson-binomial law under chance."""
    chances = agreement["chance"].to_numpy(float)
    law = np.array([1.0])
    for q in chances:  # build the count's distribution one subset at a time
        law = np.convolve(law, [1 - q, q])
    observed = int(agreement["agree"].sum())
    p = float(law[observed:].sum()) if len(chances) else math.nan
    return {"agree": observed, "subsets": len(chances), "expected": float(chances.sum()), "p": min(p, 1.0)}


def analyze_depth(
    trials: pd.DataFrame,
    out_dir: str | Path,
    *,
    num_blocks: int,
    layers: pd.DataFrame | None = None,
    predictors: pd.DataFrame | None = None,
    n_boot: int = N_BOOT,
    alpha: float = multiple.ALPHA,
) -> DepthAnalysis:
    """Analyze whether the most plastic depth is the best one, and how well each predictor ranks configurations.

    Args:
        trials: The trial table, trials at several depths.
        out_dir: Where the CSV files go.
        num_blocks: The model's number of blocks.
        layers: The per-layer plasticity to show, or None.
        predictors: Extra columns per (components, depth), such as ``in_network_mean``, or None.
        n_boot: Bootstrap resamples.
        alpha: The family's level.

    Returns:
        The depth analysis.
    """
    trials = trials.assign(depth=trials["depth"].fillna("all").astype(str))
    table = depth_table(trials, predictors)
    score = (
        "in_network_mean"
        if "in_network_mean" in table and table["in_network_mean"].notna().any()
        else "plasticity_mean"
    )
    found = DepthAnalysis(table, depth_agreement(table, score, num_blocks), score=score, layers=layers)
    found.test = agreement_test(found.agreement)
    statistics: list[Statistics] = []
    if BASELINE in table:
        runs = runs_of(trials, list(zip(table["components"], table["depth"])), ("components", "depth"))
        options = dict(n_boot=n_boot, seed=0, min_points=MIN_POINTS)
        statistics = [_predictor_statistics(table, runs, p, **options) for p in DEPTH_PREDICTORS if p in table]
    found.family, found.alpha = _judge(found, statistics, alpha), alpha
    if statistics:
        found.comparison = _comparison_frame(statistics)
    found.files = _write(found, Path(out_dir).expanduser())
    return found


def _judge(found: DepthAnalysis, statistics: list[Statistics], alpha: float) -> int:
    """Judge each predictor's difference and the agreement count in one Holm family."""
    flat = [s for s in statistics if s.row["predictor"] != BASELINE]
    test = found.test
    estimates = [s.row["diff_vs_baseline"] for s in flat] + [test["agree"] - test["expected"]]
    given = [None] * len(flat) + [test["p"] if test["subsets"] else None]
    judged = multiple.judge(estimates, [s.samples for s in flat] + [None], given, alpha=alpha)
    _fill_verdicts(flat, judged.iloc[: len(flat)])
    last = judged.iloc[-1]
    test.update(
        p_holm=last["p_holm"],
        verdict={"above 0": "more often than chance"}.get(last["verdict"], "not more often than chance"),
    )
    return int(judged.attrs["family"])


def _write(found: DepthAnalysis, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "depth_table.csv", out / "depth_agreement.csv"]
    found.table.to_csv(files[0], index=False)
    found.agreement.to_csv(files[1], index=False)
    if found.comparison is not None:
        files.append(out / "depth_criteria.csv")
        found.comparison.to_csv(files[-1], index=False)
    if found.layers is not None:
        files.append(out / "plasticity_per_layer.csv")
        found.layers.to_csv(files[-1])
    return files


def describe_depth(found: DepthAnalysis) -> str:
    """Describe the depth analysis as text."""
    lines = []
    if found.layers is not None:
        lines += [
            f"Plasticity per component (rows) and layer (columns: block index), {_variant(found.score)}:",
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
    for column in ("in_network_mean", "plasticity_mean"):
        if column in t:
            shown[column] = t[column].map(lambda v: "" if pd.isna(v) else f"{v:.3g}")
    if "trainable_params" in t:
        shown["trainable"] = t["trainable_params"].map(lambda v: "" if pd.isna(v) else f"{int(v):,}")
    lines += ["Where to finetune: each subset at each depth, test accuracy at its best lr (mean ± std over seeds):"]
    lines += [shown.to_string(index=False)]
    lines += _agreement_lines(found)
    if found.comparison is not None:
        lines += ["", _comparison_text(found)]
    return "\n".join(lines)


def _variant(score: str) -> str:
    return "in-network (each layer on its real input)" if score == "in_network_mean" else "paper variant"


def _agreement_lines(found: DepthAnalysis) -> list[str]:
    """Describe each subset's best and most plastic depths, and the count against chance."""
    agreement, test = found.agreement, found.test
    if agreement.empty:
        return ["", "No subset was trained at two depths of which neither contains the other: no depth to compare."]
    lines = [
        "",
        f"Is a subset's most plastic depth ({found.score}) its best one, among depths none of which contains another?",
    ]
    for r in agreement.itertuples():
        rho = "" if not np.isfinite(r.spearman) else f", Spearman over depths {r.spearman:+.2f}"
        lines.append(
            f"  {r.components:<24} best {r.best_depth:<7} most plastic {r.most_plastic_depth:<7} "
            f"{'yes' if r.agree else 'no '}  (by accuracy {r.by_accuracy}{rho})"
        )
    lines.append(
        f"  -> the most plastic depth was the best one for {test['agree']} of {test['subsets']} subsets; by chance "
        f"{test['expected']:.2f} (one over the depths compared, per subset); exact p={test['p']:.3g} of at least "
        f"{test['agree']}, {corrected_p(multiple.CORRECTION)}={test['p_holm']:.3g} over the {found.family} verdicts: {test['verdict']}."
    )
    return lines


def _comparison_text(found: DepthAnalysis) -> str:
    lines = [
        f"Which predictor ranks the configurations (subset x depth) by test accuracy at their best rate? Hierarchical "
        f"bootstrap; difference to log(#trainable params) with its interval adjusted for the {found.family} verdicts "
        f"({family_clause(found.alpha, multiple.CORRECTION, found.family)}):"
    ]
    lines += [_comparison_line(r, kendall=False) for r in found.comparison.itertuples()]
    better = found.comparison[found.comparison["verdict"] == "better"]
    lines.append(
        "  -> "
        + (
            f"{', '.join(better['predictor'])} rank(s) the configurations better than the parameter count after {CORRECTIONS[multiple.CORRECTION]}."
            if len(better)
            else f"No predictor ranks the configurations better than the parameter count after {CORRECTIONS[multiple.CORRECTION]}."
        )
    )
    return "\n".join(lines)
