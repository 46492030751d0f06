"""Describe the criteria lab in words, generating every sentence from its figures."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from vitplast_tune.analysis import multiple
from vitplast_tune.analysis.bracket import INTERIOR
from vitplast_tune.analysis.correlation import interval
from vitplast_tune.analysis.subsets import LabResult, _is_block_subset
from vitplast_tune.analysis.verdicts import corrected_p, family_clause
from vitplast_tune.predictors.scores import BASELINE


def describe_subsets(result: LabResult) -> str:
    """Describe each subset at its best rate, the rates it was trained at, and whether it is in the verdict."""
    t = result.table
    shown = pd.DataFrame(
        {
            "components": t["components"],
            "best lr": t["lr"].map(lambda v: f"{v:.3g}"),
            "test acc": [_mean_std(m, s) for m, s in zip(t["mean"], t["std"])],
            "seeds": t["n_seeds"],
            "rates": [" ".join(f"{r:g}" for r in lrs) for lrs in t["lrs"]],
            "added": [" ".join(f"{r:g}" for r in a) or "-" for a in t["added"]],
            "best rate": t["position"],
            "in verdict": ["yes" if v else "no" for v in t["in_verdict"]],
        }
    )
    out = [shown.to_string(index=False)]
    edges = t[t["components"].map(_is_block_subset) & (t["position"] != INTERIOR)]
    if len(edges):
        out.append(
            f"  {len(edges)} subset(s) left out of the verdict, their best rate still at an end of the rates tried: "
            + ", ".join(f"{r.components} ({r.position}, {r.lr:g})" for r in edges.itertuples())
        )
    extended = t[t["added"].map(len) > 0]
    if len(extended):
        out.append(f"  {len(extended)} subset(s) trained at rates beyond the grid's (column added).")
    return "\n".join(out)


def _mean_std(mean: float, std: float) -> str:
    """Write a mean and std of accuracies as percentages, such as "97.12 ± 1.13%"."""
    return f"{100 * mean:.2f} ± {100 * std:.2f}%" if np.isfinite(std) else f"{100 * mean:.2f}%"


def _describe_comparison(result: LabResult, what: str = "subsets") -> str:
    """Describe each predictor's correlations, its difference to the baseline and its verdict."""
    lines = [
        f"Which pre-training predictor ranks the {what} (test accuracy at each one's best rate)? Hierarchical "
        f"bootstrap ({result.n_boot} resamples of the {what} and their seeds, the rate chosen again each time); "
        f"difference = its Spearman minus log(#trainable params)'s on the same rows, its interval adjusted for the "
        f"verdicts of this lab ({family_clause(result.alpha, multiple.CORRECTION, result.family)}; level in brackets):"
    ]
    lines += [_comparison_line(r, n_boot=result.n_boot) for r in result.comparison.itertuples()]
    return "\n".join(lines)


def _comparison_line(r: Any, *, n_boot: int | None = None, kendall: bool = True) -> str:
    """Word one predictor's comparison row; with ``n_boot`` it prints the raw p and a floor of ``1/n_boot`` for 0."""
    if r.note:
        return f"  {r.predictor:<22} n={r.n}: {r.note}"
    line = f"  {r.predictor:<22} n={r.n:<3} Spearman {r.spearman:+.2f} {interval(r.spearman_low, r.spearman_high)}"
    if kendall:
        line += f"  Kendall {r.kendall:+.2f} {interval(r.kendall_low, r.kendall_high)}"
    if r.predictor == BASELINE:
        return line
    line += f"  diff {r.diff_vs_baseline:+.2f}"
    if np.isfinite(r.p):
        line += f" {interval(r.diff_low, r.diff_high)} ({multiple._describe_level(r.level)}) "
        line += (
            f"p={_format_p(r.p, n_boot)} {corrected_p(multiple.CORRECTION)}={_format_p(r.p_holm, n_boot)}"
            if n_boot
            else f"{corrected_p(multiple.CORRECTION)}={r.p_holm:.2g}"
        )
    return f"{line} {r.verdict}"


def _format_p(p: float, n_boot: int) -> str:
    return f"<{1 / n_boot:.2g}" if p == 0 else f"{p:.2g}"


def _describe_agreement(agreement: dict) -> str:
    """Describe the single-component agreement in one line."""
    a = agreement
    if not np.isfinite(a["spearman"]):
        return f"Single components by test accuracy vs by {a['score']}: fewer than 3 at an interior rate, no test."
    return (
        f"Single components ({a['n']}, each at its best rate): by test accuracy {a['by_accuracy']}; by {a['score']} "
        f"{a['by_score']}; Spearman {a['spearman']:+.2f}, exact permutation p={a['p']:.3g}, {corrected_p(multiple.CORRECTION)}={a['p_holm']:.3g}"
        f" ({a['verdict']})"
    )


def conclusions(results: list[LabResult], what: str = "subsets") -> list[str]:
    """Write the lab's closing sentences from its figures, budget by budget, then where the budgets differ."""
    lines = []
    for r in results:
        at = f" at {r.budget} steps" if r.budget is not None else ""
        lines += [s + at + "." if not s.endswith(".") else s for s in _budget_sentences(r, what)]
    if len(results) > 1:
        lines.append(_across_budgets(results))
    return lines


def _budget_sentences(r: LabResult, what: str) -> list[str]:
    table = r.comparison[r.comparison["predictor"] != BASELINE]
    judged = table[table["verdict"].isin(["better", "worse", "no clear difference"])]
    family = family_clause(r.alpha, multiple.CORRECTION, r.family)
    if judged.empty:
        reasons = sorted({v or n for v, n in zip(table["verdict"], table["note"]) if v or n})
        return [f"No verdict on the {what}: {'; '.join(reasons) or 'no predictor to compare'}", _agreement_sentence(r)]
    better = judged[judged["verdict"] == "better"].sort_values("diff_vs_baseline", ascending=False)
    worse = judged[judged["verdict"] == "worse"]
    out = []
    for b in better.itertuples():
        out.append(
            f"{b.predictor} ranks the {what} better than log(#trainable parameters) ({family}): Spearman "
            f"{b.spearman:+.2f} against {b.baseline_spearman:+.2f}, difference {b.diff_vs_baseline:+.2f} "
            f"{interval(b.diff_low, b.diff_high)} at {multiple._describe_level(b.level)}, {corrected_p(multiple.CORRECTION)}={_format_p(b.p_holm, r.n_boot)}"
        )
    if better.empty:
        out.append(
            f"No predictor ranks the {what} better than log(#trainable parameters) ({family}): no adjusted interval "
            "of a difference lies above 0"
        )
    if len(worse):
        listed = ", ".join(f"{w.predictor} ({w.diff_vs_baseline:+.2f})" for w in worse.itertuples())
        out.append(f"Worse than the parameter count after the same correction: {listed}")
    out.append(_agreement_sentence(r))
    left = int((r.table["components"].map(_is_block_subset) & ~r.table["in_verdict"]).sum())
    if left:
        out.append(f"{left} subset(s) were left out, their best rate at an end of the rates they were trained at")
    return out


def _agreement_sentence(r: LabResult) -> str:
    a = r.agreement
    if not np.isfinite(a["spearman"]):
        return "The single components could not be ranked against their plasticity (fewer than 3 at an interior rate)"
    text = (
        f"The paper's narrower claim, that the {a['n']} single components rank by test accuracy as by "
        f"{a['score']}, {a['verdict']}: {a['by_accuracy']} against {a['by_score']}, Spearman {a['spearman']:+.2f}, "
        f"exact p={a['p']:.3g}, {corrected_p(multiple.CORRECTION)}={a['p_holm']:.3g}"
    )
    strictest = r.alpha / max(r.family, 1)
    if a["verdict"] == "not established" and a.get("smallest_p", 0) > strictest:
        text += (
            f" (with {a['n']} components no ordering can give an exact p below {a['smallest_p']:.3g}, above the "
            f"family's first threshold {strictest:.2g})"
        )
    return text


def _across_budgets(results: list[LabResult]) -> str:
    """Say which predictors' verdicts differ between the budgets."""
    verdicts: dict[str, list[tuple[int | None, str]]] = {}
    for r in results:
        for row in r.comparison.itertuples():
            if row.predictor != BASELINE:
                verdicts.setdefault(row.predictor, []).append((r.budget, row.verdict or row.note))
    changed = {p: v for p, v in verdicts.items() if len({w for _, w in v}) > 1}
    if not changed:
        return "Every verdict is the same at every budget."
    listed = "; ".join(f"{p} ({', '.join(f'{w} at {b}' for b, w in v)})" for p, v in changed.items())
    return f"The verdicts of {len(changed)} of {len(verdicts)} predictors differ between the budgets: {listed}."


def describe_lab(results: list[LabResult], what: str = "subsets") -> str:
    """Describe the whole lab as text, budget by budget, then its conclusions.

    Args:
        results: The lab's results, one per budget.
        what: What the text calls the rows, such as "subsets".

    Returns:
        The text.
    """
    parts = []
    for r in results:
        head = f"--- the criteria lab at {r.budget} steps ---\n" if r.budget is not None and len(results) > 1 else ""
        parts.append(
            head
            + "Each subset at its best rate (mean validation accuracy over seeds), test accuracy there:\n"
            + describe_subsets(r)
            + "\n\n"
            + _describe_comparison(r, what)
            + "\n  "
            + _describe_agreement(r.agreement)
        )
    parts.append(
        "\n".join(["What it says (generated from the figures above):", *(f"  {s}" for s in conclusions(results, what))])
    )
    return "\n\n".join(parts)
