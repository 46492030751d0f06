"""The criteria lab: per subset at its best learning rate, which predictor computed before training (plasticity,
gradient norms, Auto-RGN, "contains attention or feed-forward") ranks the subsets' test accuracy better than
log(#trainable parameters)?

Every subset of the block components is taken at its best rate (mean validation accuracy over seeds), and a subset
whose best rate lies at an end of the rates it was trained at is marked and left out of the verdict (a lab extends its
grid first: ``labs.py``). The intervals come from the hierarchical bootstrap (``resampling``: subsets resampled, and
their seeds within them, the rate chosen again each time). Every verdict the lab prints, one per predictor against the
parameter count at each budget and the paper's narrower claim on the single components (an exact permutation test),
is one family under Holm (``multiple``), and the closing sentences are generated from those figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vitplast_tune.analysis import multiple
from vitplast_tune.analysis.bootstrap import MAX_DEGENERATE
from vitplast_tune.analysis.bracket import INTERIOR, bracket_table
from vitplast_tune.analysis.correlation import (
    MIN_POINTS,
    interval,
    kendall,
    permutation_p,
    spearman,
)
from vitplast_tune.analysis.protocol import best_lr_table
from vitplast_tune.analysis.resampling import Runs, point_targets, resample, runs_of
from vitplast_tune.analysis.verdicts import corrected_p, family_clause
from vitplast_tune.components import BLOCK_COMPONENTS, parse_subset, subset_name
from vitplast_tune.predictors.scores import BASELINE, LAB_PREDICTORS, contains_mha_or_fc, log_trainable_params

N_BOOT = 4000  # hierarchical resamples per lab: p-values down to 1/2000, below the smallest Holm step of a family
AGREEMENT_SCORE = "plasticity_mean"  # the paper's claim: single components rank by accuracy as by their plasticity
WORDS = {"above 0": "better", "below 0": "worse", "not different from 0": "no clear difference"}


def is_block_subset(components) -> bool:
    """Whether a subset trains block components only (no embedding, not the head alone, not ``all``)."""
    names = set(parse_subset(components))
    return bool(names) and names <= set(BLOCK_COMPONENTS)


def subset_table(
    trials: pd.DataFrame,
    predictors: pd.DataFrame | None = None,
    *,
    grid_lrs: list[float] | None = None,
    columns: tuple[str, ...] = LAB_PREDICTORS,
) -> pd.DataFrame:
    """Per subset at its best lr (``best_lr_table`` on test accuracy) with every pre-training predictor beside it, and
    where that rate lies: ``lrs`` (every rate trained), ``added`` (those beyond ``grid_lrs``, the space's own rates),
    ``position`` (``bracket.bracket_table``) and ``in_verdict`` (a block subset at an interior best rate).

    Predictors (``columns``) come from the trial table (the first value per subset: plasticity scores, trainable_params
    -> log_trainable_params, contains_mha_or_fc) and from ``predictors`` (indexed by subset name, e.g. in-network).
    """
    select = "best_val_acc" if "best_val_acc" in trials else "val_acc"
    table = best_lr_table(trials, "test_acc", select_by=select).set_index("components")
    names = pd.Series([subset_name(c) for c in trials["components"]], index=trials.index)
    first = trials.groupby(names).first()
    for column in (c for c in columns if c in first):
        table[column] = pd.to_numeric(first[column], errors="coerce").reindex(table.index)
    if "trainable_params" in first:
        table[BASELINE] = log_trainable_params(first["trainable_params"].reindex(table.index))
    table["contains_mha_or_fc"] = [contains_mha_or_fc(c) for c in table.index]
    if predictors is not None:
        for column in predictors.columns:
            table[column] = pd.to_numeric(predictors[column], errors="coerce").reindex(table.index)
    bracket = bracket_table(trials, select).set_index("components").reindex(table.index)
    grid = set(grid_lrs) if grid_lrs is not None else None
    table["lrs"] = bracket["lrs"]
    table["added"] = [[r for r in lrs if grid is not None and r not in grid] for lrs in bracket["lrs"]]
    table["position"] = bracket["position"]
    table["in_verdict"] = [is_block_subset(c) and p == INTERIOR for c, p in zip(table.index, bracket["position"])]
    return table.rename_axis("components").reset_index()


@dataclass
class Statistics:
    """One predictor's figures on the lab's subsets, and the bootstrap values of its difference to the baseline."""

    row: dict
    samples: np.ndarray | None = None  # the difference to the baseline on each resample (NaN where undefined)


def predictor_statistics(
    table: pd.DataFrame, runs: Runs, predictor: str, *, n_boot: int, seed: int, min_points: int
) -> Statistics:
    """Spearman and Kendall of ``predictor`` with each subset's test accuracy at its best rate, and the difference of
    its Spearman to the baseline's, on the subsets where both are known (``n``), by the hierarchical bootstrap
    (``resampling.resample``: the same resamples for every predictor on the same subsets, so the difference is
    paired). 95% percentile intervals for the correlations; the difference's interval and verdict come with the
    family (``judge_family``)."""
    x, base = (pd.to_numeric(table[c], errors="coerce").to_numpy(float) for c in (predictor, BASELINE))
    keep = np.isfinite(x) & np.isfinite(base)
    row = {"predictor": predictor, "n": int(keep.sum()), "note": ""}
    row |= dict.fromkeys(_STAT_COLUMNS, math.nan)
    if keep.sum() < 5 or len(np.unique(x[keep])) < 2:
        row["note"] = "too few subsets (n < 5)" if keep.sum() < 5 else "predictor is constant"
        return Statistics(row)
    part = runs.subset(keep)
    y = point_targets(part)
    drawn, targets = resample(part, n_boot, seed)
    xs, bs = x[keep][drawn], base[keep][drawn]
    rho, tau = spearman(xs, targets), kendall(xs, targets)
    row |= {"spearman": spearman(x[keep], y), "kendall": kendall(x[keep], y)}
    row["spearman_low"], row["spearman_high"] = multiple.percentile_interval(rho, 0.95)
    row["kendall_low"], row["kendall_high"] = multiple.percentile_interval(tau, 0.95)
    if predictor == BASELINE:
        return Statistics(row)
    row |= {"baseline_spearman": spearman(base[keep], y)}
    row["diff_vs_baseline"] = row["spearman"] - row["baseline_spearman"]
    diff = rho - spearman(bs, targets)
    if np.mean(~np.isfinite(diff)) > MAX_DEGENERATE:
        row["verdict"] = "undetermined"
        return Statistics(row)
    if row["n"] < min_points:
        row["verdict"] = f"no verdict (n < {min_points})"
        return Statistics(row)
    return Statistics(
        row, diff
    )  # every replicate, NaN where undefined: pooled labs average them replicate by replicate


_STAT_COLUMNS = (
    *("spearman", "spearman_low", "spearman_high", "kendall", "kendall_low", "kendall_high"),
    *("baseline_spearman", "diff_vs_baseline", "diff_low", "diff_high", "level", "p", "p_holm"),
)


def comparison_frame(statistics: list[Statistics]) -> pd.DataFrame:
    """Predictors' rows as a table with every statistic column (NaN where a row has none) and ``verdict`` ("" none)."""
    columns = ["predictor", "n", *_STAT_COLUMNS, "verdict", "note"]
    frame = pd.DataFrame([s.row for s in statistics]).reindex(columns=columns)
    for column in ("verdict", "note"):
        frame[column] = frame[column].astype(object).where(frame[column].notna(), "")
    return frame


def single_component_agreement(table: pd.DataFrame, score: str = AGREEMENT_SCORE) -> dict:
    """The paper's narrower claim on the lab's table: Spearman between the single block components' ``score`` and
    their test accuracy at their best rates, with its exact permutation p-value (two-sided; every ordering of the few
    components is enumerated, ``correlation.permutation_p``); the statistic NaN with fewer than 3 components."""
    rows = table.set_index("components")
    common = [c for c in BLOCK_COMPONENTS if c in rows.index and np.isfinite(rows.loc[c].get(score, math.nan))]
    common = [c for c in common if rows.loc[c, "position"] == INTERIOR]
    x, y = rows.loc[common, score].to_numpy(float), rows.loc[common, "mean"].to_numpy(float)
    out = {"score": score, "n": len(common), "components": "+".join(common), "spearman": math.nan, "p": math.nan}
    out["by_accuracy"] = " > ".join(rows.loc[common, "mean"].sort_values(ascending=False).index)
    out["by_score"] = " > ".join(rows.loc[common, score].sort_values(ascending=False).index)
    if len(common) >= 3 and len(np.unique(x)) > 1 and len(np.unique(y)) > 1:
        out["spearman"] = spearman(x, y)
        out["p"] = permutation_p(x, y)
        out["smallest_p"] = permutation_p(np.arange(len(common)), np.arange(len(common)))
    return out


def judge_family(results: list[LabResult], alpha: float = multiple.ALPHA) -> int:
    """Holm over every verdict of a lab (each predictor's difference to the baseline at each budget, and each budget's
    single-component agreement): fills in their p, Holm p, adjusted interval, its level and the verdict; returns the
    family's size (the hypotheses tested)."""
    flat = [s for r in results for s in r.statistics if s.row["predictor"] != BASELINE]
    agreements = [r.agreement for r in results]
    estimates = [s.row["diff_vs_baseline"] for s in flat] + [a["spearman"] for a in agreements]
    samples = [s.samples for s in flat] + [None] * len(agreements)
    given = [None] * len(flat) + [a["p"] for a in agreements]
    judged = multiple.judge(estimates, samples, given, alpha=alpha)
    fill_verdicts(flat, judged.iloc[: len(flat)])
    for a, j in zip(agreements, judged.iloc[len(flat) :].itertuples()):
        a.update(p_holm=j.p_holm, verdict=AGREEMENT_WORDS.get(j.verdict, ""))
    family = int(judged.attrs["family"])
    for r in results:
        r.family, r.alpha = family, alpha
    return family


def fill_verdicts(statistics: list[Statistics], judged: pd.DataFrame) -> None:
    """Copy a family's judgement (``multiple.judge``'s rows, in the same order) into predictors' rows: the adjusted
    interval of the difference, its level, p, Holm's p and the verdict (those with bootstrap values only)."""
    for s, j in zip(statistics, judged.itertuples()):
        if s.samples is not None:
            s.row.update(diff_low=j.low, diff_high=j.high, level=j.level, p=j.p, p_holm=j.p_holm)
            s.row["verdict"] = WORDS[j.verdict]


AGREEMENT_WORDS = {"above 0": "holds", "below 0": "is reversed", "not different from 0": "not established"}


@dataclass
class LabResult:
    """The lab at one step budget: the subsets' table, each predictor's figures and verdict, the single-component
    agreement, and the family its verdicts were judged in."""

    table: pd.DataFrame
    statistics: list[Statistics]
    agreement: dict
    budget: int | None = None
    family: int = 0
    alpha: float = multiple.ALPHA
    n_boot: int = N_BOOT

    @property
    def comparison(self) -> pd.DataFrame:
        """One row per predictor: n, Spearman and Kendall with 95% intervals, the difference to the baseline with its
        adjusted interval (``level``), p, Holm's p, the verdict, and the budget."""
        return comparison_frame(self.statistics).assign(budget=self.budget)


def criteria_lab(
    parts: dict[int | None, pd.DataFrame],
    predictors: pd.DataFrame | None = None,
    *,
    grid_lrs: list[float] | None = None,
    n_boot: int = N_BOOT,
    seed: int = 0,
    min_points: int = MIN_POINTS,
    alpha: float = multiple.ALPHA,
    columns: tuple[str, ...] = LAB_PREDICTORS,
) -> list[LabResult]:
    """Run the criteria lab on the trials of each budget, every verdict judged in one family (``judge_family``).

    Args:
        parts: The trial table of each budget (None for a single one).
        predictors: More per-subset columns (in-network plasticity).
        grid_lrs: The space's rates, so the table says which rates were added beyond them.
        n_boot: Bootstrap resamples.
        seed: The bootstrap's seed.
        min_points: The fewest subsets that get a verdict.
        alpha: The family's level.
        columns: The predictors compared (the baseline among them).

    Returns:
        One result per budget, in ``parts``' order.
    """
    results = []
    for budget, trials in parts.items():
        trials = trials.reset_index(drop=True)  # the tables select rows by label
        table = subset_table(trials, predictors, grid_lrs=grid_lrs, columns=columns)
        verdict_rows = table[table["in_verdict"]].reset_index(drop=True)
        runs = runs_of(trials, [(c,) for c in verdict_rows["components"]])
        options = dict(n_boot=n_boot, seed=seed, min_points=min_points)
        names = [p for p in columns if p in table]
        statistics = [predictor_statistics(verdict_rows, runs, p, **options) for p in names]
        results.append(LabResult(table, statistics, single_component_agreement(table), budget, n_boot=n_boot))
    judge_family(results, alpha)
    return results


def describe_subsets(result: LabResult) -> str:
    """The lab's table: each subset at its best rate, its test accuracy (mean ± std over seeds), the rates it was
    trained at and those added beyond the grid, and whether it is in the verdict."""
    t = result.table
    shown = pd.DataFrame(
        {
            "components": t["components"],
            "best lr": t["lr"].map(lambda v: f"{v:.3g}"),
            "test acc": [mean_std(m, s) for m, s in zip(t["mean"], t["std"])],
            "seeds": t["n_seeds"],
            "rates": [" ".join(f"{r:g}" for r in lrs) for lrs in t["lrs"]],
            "added": [" ".join(f"{r:g}" for r in a) or "-" for a in t["added"]],
            "best rate": t["position"],
            "in verdict": ["yes" if v else "no" for v in t["in_verdict"]],
        }
    )
    out = [shown.to_string(index=False)]
    edges = t[t["components"].map(is_block_subset) & (t["position"] != INTERIOR)]
    if len(edges):
        out.append(
            f"  {len(edges)} subset(s) left out of the verdict, their best rate still at an end of the rates tried: "
            + ", ".join(f"{r.components} ({r.position}, {r.lr:g})" for r in edges.itertuples())
        )
    extended = t[t["added"].map(len) > 0]
    if len(extended):
        out.append(f"  {len(extended)} subset(s) trained at rates beyond the grid's (column added).")
    return "\n".join(out)


def mean_std(mean: float, std: float) -> str:
    """A mean and std of accuracies as percentages, "97.12 ± 1.13%" (the mean alone when there is no std)."""
    return f"{100 * mean:.2f} ± {100 * std:.2f}%" if np.isfinite(std) else f"{100 * mean:.2f}%"


def describe_comparison(result: LabResult, what: str = "subsets") -> str:
    """Each predictor's Spearman and Kendall (hierarchical-bootstrap 95% intervals) and its difference to the
    baseline with the adjusted interval, p and Holm's p, and the verdict."""
    lines = [
        f"Which pre-training predictor ranks the {what} (test accuracy at each one's best rate)? Hierarchical "
        f"bootstrap ({result.n_boot} resamples of the {what} and their seeds, the rate chosen again each time); "
        f"difference = its Spearman minus log(#trainable params)'s on the same rows, its interval adjusted for the "
        f"verdicts of this lab ({family_clause(result.alpha, multiple.CORRECTION, result.family)}; level in brackets):"
    ]
    lines += [comparison_line(r, n_boot=result.n_boot) for r in result.comparison.itertuples()]
    return "\n".join(lines)


def comparison_line(r: Any, *, n_boot: int | None = None, kendall: bool = True) -> str:
    """One predictor's row of a comparison table in words: its rank correlations with their intervals, its
    difference to the baseline with the corrected interval, p-values and verdict (or the note why there is none).

    Args:
        r: a row of a comparison frame (``comparison_frame``), as ``itertuples`` gives it.
        n_boot: the resamples behind the p-values, which print the raw p and a floor of ``1/n_boot`` for 0 (None:
            the Holm p alone, at two significant digits).
        kendall: whether the row has Kendall's tau beside Spearman's rho.

    Returns:
        The line, indented two spaces.
    """
    if r.note:
        return f"  {r.predictor:<22} n={r.n}: {r.note}"
    line = f"  {r.predictor:<22} n={r.n:<3} Spearman {r.spearman:+.2f} {interval(r.spearman_low, r.spearman_high)}"
    if kendall:
        line += f"  Kendall {r.kendall:+.2f} {interval(r.kendall_low, r.kendall_high)}"
    if r.predictor == BASELINE:
        return line
    line += f"  diff {r.diff_vs_baseline:+.2f}"
    if np.isfinite(r.p):
        line += f" {interval(r.diff_low, r.diff_high)} ({multiple.describe_level(r.level)}) "
        line += (
            f"p={format_p(r.p, n_boot)} {corrected_p(multiple.CORRECTION)}={format_p(r.p_holm, n_boot)}"
            if n_boot
            else f"{corrected_p(multiple.CORRECTION)}={r.p_holm:.2g}"
        )
    return f"{line} {r.verdict}"


def format_p(p: float, n_boot: int) -> str:
    return f"<{1 / n_boot:.2g}" if p == 0 else f"{p:.2g}"


def describe_agreement(agreement: dict) -> str:
    """The single-component agreement as one line: both orders, Spearman, the exact p and Holm's p."""
    a = agreement
    if not np.isfinite(a["spearman"]):
        return f"Single components by test accuracy vs by {a['score']}: fewer than 3 at an interior rate, no test."
    return (
        f"Single components ({a['n']}, each at its best rate): by test accuracy {a['by_accuracy']}; by {a['score']} "
        f"{a['by_score']}; Spearman {a['spearman']:+.2f}, exact permutation p={a['p']:.3g}, {corrected_p(multiple.CORRECTION)}={a['p_holm']:.3g}"
        f" ({a['verdict']})"
    )


def conclusions(results: list[LabResult], what: str = "subsets") -> list[str]:
    """The lab's closing sentences, each generated from its figures: per budget, which predictors rank the ``what``
    better or worse than the parameter count after Holm (none is said to where no adjusted interval excludes 0),
    the single-component agreement, the subsets left out; with several budgets, where the verdicts differ."""
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
            f"{interval(b.diff_low, b.diff_high)} at {multiple.describe_level(b.level)}, {corrected_p(multiple.CORRECTION)}={format_p(b.p_holm, r.n_boot)}"
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
    left = int((r.table["components"].map(is_block_subset) & ~r.table["in_verdict"]).sum())
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
    """Which predictors' verdicts differ between the budgets, or that none does."""
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

    Per budget: the subsets' table, the comparison and the agreement.

    Args:
        results: The lab's results, one per budget.
        what: What the rows are called in the text (e.g. "subsets").

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
            + describe_comparison(r, what)
            + "\n  "
            + describe_agreement(r.agreement)
        )
    parts.append(
        "\n".join(["What it says (generated from the figures above):", *(f"  {s}" for s in conclusions(results, what))])
    )
    return "\n\n".join(parts)


def write_lab(results: list[LabResult], out: Path) -> list[Path]:
    """The lab's tables into ``out``: ``criteria.csv`` (each predictor at each budget), ``criteria_subsets.csv`` (each
    subset at its best rate, the rates it was trained at) and ``criteria_agreement.csv``; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "criteria.csv", out / "criteria_subsets.csv", out / "criteria_agreement.csv"]
    pd.concat([r.comparison for r in results], ignore_index=True).to_csv(files[0], index=False)
    tables = [r.table.assign(budget=r.budget) for r in results]
    subsets = pd.concat(tables, ignore_index=True)
    for column in ("lrs", "added"):
        subsets[column] = subsets[column].map(lambda rates: " ".join(f"{v:g}" for v in rates))
    subsets.to_csv(files[1], index=False)
    agreement = pd.DataFrame([{**r.agreement, "budget": r.budget, "family": r.family} for r in results])
    agreement.to_csv(files[2], index=False)
    return files
