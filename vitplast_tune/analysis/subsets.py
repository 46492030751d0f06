"""The criteria lab: per subset at its best learning rate, which predictor computed before training (plasticity,
gradient norms, Auto-RGN, "contains attention or feed-forward") ranks the subsets' test accuracy better than
log10(#trainable parameters)?

Every subset of the block components is taken at its best rate (mean validation accuracy over seeds), and a subset
whose best rate lies at an end of the rates it was trained at is marked and left out of the verdict (a lab extends its
grid first: ``labs.py``). The intervals come from the hierarchical bootstrap (``resampling``: subsets resampled, and
their seeds within them, the rate chosen again each time). Every verdict the lab prints, one per predictor against the
parameter count at each budget and the paper's narrower claim on the single components (an exact permutation test),
is one family under Holm (``multiple``); ``subsets_report`` puts the lab in words, generated from those figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from vitplast_tune.analysis import multiple
from vitplast_tune.analysis.bootstrap import MAX_DEGENERATE
from vitplast_tune.analysis.bracket import INTERIOR, bracket_table
from vitplast_tune.analysis.correlation import (
    MIN_POINTS,
    kendall,
    permutation_p,
    spearman,
)
from vitplast_tune.analysis.protocol import best_lr_table
from vitplast_tune.analysis.resampling import Runs, point_targets, resample, runs_of
from vitplast_tune.components import BLOCK_COMPONENTS, parse_subset, subset_name
from vitplast_tune.predictors.scores import BASELINE, lab_criteria, structure_scores

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
    columns: tuple[str, ...] | None = None,
) -> pd.DataFrame:
    """Per subset at its best lr (``best_lr_table`` on test accuracy) with every pre-training predictor beside it, and
    where that rate lies: ``lrs`` (every rate trained), ``added`` (those beyond ``grid_lrs``, the space's own rates),
    ``position`` (``bracket.bracket_table``) and ``in_verdict`` (a block subset at an interior best rate).

    Criteria (``columns``, default ``lab_criteria()``) come from the trial table (the first value per subset), from
    the subset and its trainable_params (``structure_scores``: contains_mha_or_fc, log_trainable_params) and from
    ``predictors`` (indexed by subset name, e.g. in-network).
    """
    select = "best_val_acc" if "best_val_acc" in trials else "val_acc"
    table = best_lr_table(trials, "test_acc", select_by=select).set_index("components")
    names = pd.Series([subset_name(c) for c in trials["components"]], index=trials.index)
    first = trials.groupby(names).first()
    for column in (c for c in (lab_criteria() if columns is None else columns) if c in first):
        table[column] = pd.to_numeric(first[column], errors="coerce").reindex(table.index)
    counts = first.get("trainable_params", pd.Series(dtype=float)).reindex(table.index)
    structure = pd.DataFrame([structure_scores(c, n) for c, n in counts.items()], index=table.index)
    for column in structure:  # where the count is unknown, the trial table's value stays
        table[column] = structure[column].fillna(table[column]) if column in table else structure[column]
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
    columns: tuple[str, ...] | None = None,
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
        columns: The criteria compared, the baseline among them (None: ``lab_criteria()``).

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
        names = [p for p in (lab_criteria() if columns is None else columns) if p in table]
        statistics = [predictor_statistics(verdict_rows, runs, p, **options) for p in names]
        results.append(LabResult(table, statistics, single_component_agreement(table), budget, n_boot=n_boot))
    judge_family(results, alpha)
    return results


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
