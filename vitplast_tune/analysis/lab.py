"""The criteria lab: per subset at its best learning rate, which predictor computed before training
(plasticity, gradient norms, Auto-RGN, the parameter count, "contains attention or feed-forward")
ranks the subsets' test accuracy best, against log(#trainable parameters).
"""

from __future__ import annotations

import pandas as pd

from vitplast_tune.analysis.correlation import baseline_differences, correlations
from vitplast_tune.analysis.protocol import best_lr_table
from vitplast_tune.components import subset_name
from vitplast_tune.predictors.scores import BASELINE, contains_mha_or_fc, log_trainable_params

LAB_PREDICTORS: tuple[str, ...] = (
    "plasticity_mean",
    "plasticity_max",
    "plasticity_weighted",
    "in_network_mean",
    "grad_norm",
    "rgn",
    "rgn_mean",
    "contains_mha_or_fc",
    BASELINE,
)


def subset_table(trials: pd.DataFrame, predictors: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per subset at its best lr (``best_lr_table`` on test accuracy) with every pre-training predictor beside it.

    Predictors come from the trial table (the first value per subset: plasticity scores, trainable_params ->
    log_trainable_params, contains_mha_or_fc) and from ``predictors`` (indexed by subset name, e.g. criteria).
    """
    select = "best_val_acc" if "best_val_acc" in trials else "val_acc"
    table = best_lr_table(trials, "test_acc", select_by=select).set_index("components")
    names = pd.Series([subset_name(c) for c in trials["components"]], index=trials.index)
    first = trials.groupby(names).first()
    for column in (c for c in LAB_PREDICTORS if c in first):
        table[column] = pd.to_numeric(first[column], errors="coerce").reindex(table.index)
    if "trainable_params" in first:
        table[BASELINE] = log_trainable_params(first["trainable_params"].reindex(table.index))
    table["contains_mha_or_fc"] = [contains_mha_or_fc(c) for c in table.index]
    if predictors is not None:
        for column in predictors.columns:
            table[column] = pd.to_numeric(predictors[column], errors="coerce").reindex(table.index)
    return table.rename_axis("components").reset_index()


def criteria_comparison(
    subsets: pd.DataFrame,
    predictors: list[str] | None = None,
    target: str = "mean",
    *,
    n_boot: int = 2000,
    seed: int = 0,
    min_trials: int = 5,
) -> pd.DataFrame:
    """Each predictor's Spearman and Kendall with ``target`` (BCa 95%), and its paired difference against the baseline.

    One row per predictor present in ``subsets``; the baseline is log(#trainable parameters).
    """
    predictors = [p for p in (predictors or LAB_PREDICTORS) if p in subsets]
    table = correlations(subsets, predictors, target, n_boot=n_boot, seed=seed, min_trials=min_trials)
    table = table.drop(columns=["n_boot", "spearman_p", "kendall_p"])
    return baseline_differences(table, subsets, BASELINE, n_boot=n_boot, seed=seed)


def criteria_winner(comparison: pd.DataFrame, what: str = "subsets") -> str:
    """One sentence: the best predictor that beats log(#trainable parameters) at ranking ``what``, or that none does."""
    better = comparison[comparison["verdict"] == "better"]
    if better.empty:
        return (
            f"No predictor ranks the {what} clearly better than log(#trainable parameters) "
            "(every paired-bootstrap interval of the Spearman difference includes 0 or lies below it)."
        )
    best = better.loc[better["spearman"].idxmax()]
    return (
        f"{best['predictor']} ranks the {what} best and beats log(#trainable parameters): Spearman "
        f"{best['spearman']:+.2f}, difference {best['diff_vs_baseline']:+.2f} "
        f"[{best['diff_low']:+.2f}, {best['diff_high']:+.2f}]."
    )


def describe_criteria(comparison: pd.DataFrame, what: str = "subsets") -> str:
    """The criteria table as text (Spearman, Kendall with BCa intervals, difference to the baseline) and the winner;
    ``what`` the table ranks ("subsets", or "configurations (subset x depth)")."""
    lines = [
        f"Which pre-training predictor ranks the {what} (test accuracy at each subset's best lr)? "
        "BCa 95% intervals; difference = Spearman minus that of log(#trainable params), paired bootstrap:"
    ]
    for r in comparison.itertuples():
        if r.note:
            lines.append(f"  {r.predictor:<22} n={r.n}: {r.note}")
            continue
        diff = (
            ""
            if r.predictor == BASELINE
            else (f"  diff {r.diff_vs_baseline:+.2f} [{r.diff_low:+.2f}, {r.diff_high:+.2f}] {r.verdict}")
        )
        lines.append(
            f"  {r.predictor:<22} Spearman {r.spearman:+.2f} [{r.spearman_low:+.2f}, {r.spearman_high:+.2f}]"
            f"  Kendall {r.kendall:+.2f} [{r.kendall_low:+.2f}, {r.kendall_high:+.2f}]{diff}"
        )
    lines.append("  -> " + criteria_winner(comparison, what))
    return "\n".join(lines)
