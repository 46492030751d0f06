"""The criteria lab: per subset at its best learning rate, which predictor computed before training
(plasticity, gradient norms, Auto-RGN, the parameter count, "contains attention or feed-forward")
ranks the subsets' test accuracy best, against log(#trainable parameters); with several step budgets, the
verdict at each and whether it held.
"""

from __future__ import annotations

import pandas as pd

from vitplast_tune.analysis.correlation import MIN_POINTS, compare_with_baseline, interval
from vitplast_tune.analysis.protocol import best_lr_table
from vitplast_tune.components import subset_name
from vitplast_tune.predictors.scores import BASELINE, contains_mha_or_fc, log_trainable_params

LAB_PREDICTORS: tuple[str, ...] = (
    "plasticity_mean",
    "plasticity_max",
    "plasticity_weighted",
    "in_network_mean",
    "grad_norm",
    "grad_norm_ratio",
    "auto_rgn",
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
    min_points: int = MIN_POINTS,
) -> pd.DataFrame:
    """Each predictor's Spearman and Kendall with ``target`` (BCa 95%) and its paired difference against the
    baseline, all on the subsets where the predictor, the baseline and the target are known (``n``)
    (``correlation.compare_with_baseline``). One row per predictor present in ``subsets``."""
    predictors = [p for p in (predictors or LAB_PREDICTORS) if p in subsets]
    table = compare_with_baseline(
        subsets, predictors, BASELINE, target, n_boot=n_boot, seed=seed, min_trials=min_trials, min_points=min_points
    )
    return table.drop(columns=["n_boot", "spearman_p", "kendall_p"])


def criteria_winner(comparison: pd.DataFrame, what: str = "subsets") -> str:
    """One sentence: the best predictor that beats log(#trainable parameters) at ranking ``what``, that none does, or
    that the comparison cannot say (too few subsets for a verdict, or intervals that could not be formed)."""
    verdicts = comparison["verdict"].fillna("")
    better = comparison[verdicts == "better"]
    if better.empty:
        judged = comparison[verdicts.isin(["worse", "no clear difference"])]
        if judged.empty and (verdicts != "").any():
            return "No verdict: " + _first_reason(verdicts) + "; the figures above are shown, not judged."
        return (
            f"No predictor ranks the {what} clearly better than log(#trainable parameters) "
            "(every paired-bootstrap interval of the Spearman difference includes 0 or lies below it"
            + ("; some are undetermined" if (verdicts == "undetermined").any() else "")
            + ")."
        )
    best = better.loc[better["spearman"].idxmax()]
    return (
        f"{best['predictor']} ranks the {what} best and beats log(#trainable parameters): Spearman "
        f"{best['spearman']:+.2f}, difference {best['diff_vs_baseline']:+.2f} "
        f"[{best['diff_low']:+.2f}, {best['diff_high']:+.2f}] (n={int(best['n'])})."
    )


def _first_reason(verdicts: pd.Series) -> str:
    reasons = [v for v in verdicts if v and v not in ("better", "worse", "no clear difference")]
    return {"undetermined": "every interval of the difference is undetermined"}.get(reasons[0], reasons[0])


def describe_criteria(comparison: pd.DataFrame, what: str = "subsets") -> str:
    """The criteria table as text (Spearman, Kendall with BCa intervals, difference to the baseline on the same
    rows, n) and the winner; ``what`` the table ranks ("subsets", or "configurations (subset x depth)")."""
    lines = [
        f"Which pre-training predictor ranks the {what} (test accuracy at each subset's best lr)? "
        "BCa 95% intervals; each row on the ones where the predictor and log(#trainable params) are both known "
        "(n); difference = its Spearman minus that of log(#trainable params) on those rows, paired bootstrap:"
    ]
    for r in comparison.itertuples():
        if r.note:
            lines.append(f"  {r.predictor:<22} n={r.n}: {r.note}")
            continue
        diff = (
            ""
            if r.predictor == BASELINE
            else (
                f"  diff {r.diff_vs_baseline:+.2f} {interval(r.diff_low, r.diff_high)}"
                f" (vs {r.baseline_spearman:+.2f}) {r.verdict}"
            )
        )
        lines.append(
            f"  {r.predictor:<22} n={r.n:<3} Spearman {r.spearman:+.2f} {interval(r.spearman_low, r.spearman_high)}"
            f"  Kendall {r.kendall:+.2f} {interval(r.kendall_low, r.kendall_high)}{diff}"
        )
    lines.append("  -> " + criteria_winner(comparison, what))
    return "\n".join(lines)


def verdicts_by_budget(criteria: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, str], bool]:
    """The lab at several budgets (``criteria`` with a ``budget`` column): per predictor its Spearman, difference
    and verdict at each budget (columns ``<budget>``), the winner sentence per budget, and whether the verdict
    held: the same predictor best among those that beat the baseline (or none) at every budget."""
    budgets = sorted(criteria["budget"].unique())
    table = pd.DataFrame(index=pd.Index(list(dict.fromkeys(criteria["predictor"])), name="predictor"))
    winners, best = {}, set()
    for budget in budgets:
        rows = criteria[criteria["budget"] == budget].set_index("predictor")
        table[int(budget)] = [_cell(rows.loc[p]) if p in rows.index else "" for p in table.index]
        winners[int(budget)] = criteria_winner(rows.reset_index())
        better = rows[rows["verdict"] == "better"]
        best.add(better["spearman"].idxmax() if len(better) else None)
    return table, winners, len(best) == 1


def _cell(row: pd.Series) -> str:
    if row["note"]:
        return row["note"]
    if not row["verdict"]:
        return f"{row['spearman']:+.2f}"
    return f"{row['spearman']:+.2f}, diff {row['diff_vs_baseline']:+.2f} {row['verdict']}"


def describe_budgets(criteria: pd.DataFrame) -> str:
    """Did the lab's verdict hold across budgets? Per predictor its Spearman and verdict at each, then each
    budget's winner and one line that says whether they agree."""
    table, winners, held = verdicts_by_budget(criteria)
    steps = " and ".join(f"{b} steps" for b in winners)
    lines = [f"The criteria lab at {steps} (Spearman with test accuracy; difference to log(#trainable params)):"]
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        lines.append(table.rename(columns=lambda b: f"{b} steps").to_string())
    lines += [f"  at {b} steps: {w}" for b, w in winners.items()]
    lines.append(
        "  -> the verdict held at every budget" if held else "  -> the verdict did NOT hold: it changes with the budget"
    )
    return "\n".join(lines)
