"""Judge which pre-training predictor ranks the subsets' test accuracy better than the parameter count."""

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

N_BOOT = 4000  # resamples per lab, so p-values reach 1/2000, below a family's smallest Holm step
AGREEMENT_SCORE = "plasticity_mean"  # the paper claims single components rank by accuracy as by this score
WORDS = {"above 0": "better", "below 0": "worse", "not different from 0": "no clear difference"}


def _is_block_subset(components) -> bool:
    """Return whether a subset trains block components only."""
    names = set(parse_subset(components))
    return bool(names) and names <= set(BLOCK_COMPONENTS)


def subset_table(
    trials: pd.DataFrame,
    predictors: pd.DataFrame | None = None,
    *,
    grid_lrs: list[float] | None = None,
    columns: tuple[str, ...] | None = None,
) -> pd.DataFrame:
    """Tabulate each subset at its best lr with every criterion, and where that rate lies among those trained."""
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
    # Only a block subset whose best rate lies inside its grid enters the verdict.
    table["in_verdict"] = [_is_block_subset(c) and p == INTERIOR for c, p in zip(table.index, bracket["position"])]
    return table.rename_axis("components").reset_index()


@dataclass
class Statistics:
    """Hold one predictor's figures and the bootstrap values of its difference to the baseline."""

    row: dict
    samples: np.ndarray | None = None  # NaN where the difference is undefined


def _predictor_statistics(
    table: pd.DataFrame, runs: Runs, predictor: str, *, n_boot: int, seed: int, min_points: int
) -> Statistics:
    """Correlate ``predictor`` with the subsets' accuracy and bootstrap its Spearman's difference to the baseline's."""
    x, base = (pd.to_numeric(table[c], errors="coerce").to_numpy(float) for c in (predictor, BASELINE))
    keep = np.isfinite(x) & np.isfinite(base)
    row = {"predictor": predictor, "n": int(keep.sum()), "note": ""}
    row |= dict.fromkeys(_STAT_COLUMNS, math.nan)
    if keep.sum() < 5 or len(np.unique(x[keep])) < 2:
        row["note"] = "too few subsets (n < 5)" if keep.sum() < 5 else "predictor is constant"
        return Statistics(row)
    part = runs.subset(keep)
    y = point_targets(part)
    drawn, targets = resample(
        part, n_boot, seed
    )  # every predictor sees the same resamples, so the difference is paired
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
    return Statistics(row, diff)  # pooled labs average these replicate by replicate


_STAT_COLUMNS = (
    *("spearman", "spearman_low", "spearman_high", "kendall", "kendall_low", "kendall_high"),
    *("baseline_spearman", "diff_vs_baseline", "diff_low", "diff_high", "level", "p", "p_holm"),
)


def _comparison_frame(statistics: list[Statistics]) -> pd.DataFrame:
    """Tabulate the predictors' rows with every statistic column."""
    columns = ["predictor", "n", *_STAT_COLUMNS, "verdict", "note"]
    frame = pd.DataFrame([s.row for s in statistics]).reindex(columns=columns)
    for column in ("verdict", "note"):
        frame[column] = frame[column].astype(object).where(frame[column].notna(), "")
    return frame


def _single_component_agreement(table: pd.DataFrame, score: str = AGREEMENT_SCORE) -> dict:
    """Test exactly whether at least 3 single components rank by ``score`` as by their accuracy."""
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


def _judge_family(results: list[LabResult], alpha: float = multiple.ALPHA) -> int:
    """Judge every verdict of a lab at every budget in one Holm family, and return the family's size."""
    flat = [s for r in results for s in r.statistics if s.row["predictor"] != BASELINE]
    agreements = [r.agreement for r in results]
    estimates = [s.row["diff_vs_baseline"] for s in flat] + [a["spearman"] for a in agreements]
    samples = [s.samples for s in flat] + [None] * len(agreements)
    given = [None] * len(flat) + [a["p"] for a in agreements]
    judged = multiple.judge(estimates, samples, given, alpha=alpha)
    _fill_verdicts(flat, judged.iloc[: len(flat)])
    for a, j in zip(agreements, judged.iloc[len(flat) :].itertuples()):
        a.update(p_holm=j.p_holm, verdict=AGREEMENT_WORDS.get(j.verdict, ""))
    family = int(judged.attrs["family"])
    for r in results:
        r.family, r.alpha = family, alpha
    return family


def _fill_verdicts(statistics: list[Statistics], judged: pd.DataFrame) -> None:
    """Copy a family's judgement into the rows of the predictors that have bootstrap values."""
    for s, j in zip(statistics, judged.itertuples()):
        if s.samples is not None:
            s.row.update(diff_low=j.low, diff_high=j.high, level=j.level, p=j.p, p_holm=j.p_holm)
            s.row["verdict"] = WORDS[j.verdict]


AGREEMENT_WORDS = {"above 0": "holds", "below 0": "is reversed", "not different from 0": "not established"}


@dataclass
class LabResult:
    """Hold the lab at one step budget: the subsets, each predictor's verdict, the agreement and the family."""

    table: pd.DataFrame
    statistics: list[Statistics]
    agreement: dict
    budget: int | None = None
    family: int = 0
    alpha: float = multiple.ALPHA
    n_boot: int = N_BOOT

    @property
    def comparison(self) -> pd.DataFrame:
        """Tabulate one row per predictor with its figures, verdict and budget."""
        return _comparison_frame(self.statistics).assign(budget=self.budget)


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
    """Run the criteria lab on the trials of each budget, and judge every verdict in one family.

    Args:
        parts: The trial table of each budget, keyed None for a single one.
        predictors: More per-subset columns, such as in-network plasticity.
        grid_lrs: The space's rates, so that the table says which rates were added.
        n_boot: Bootstrap resamples.
        seed: The bootstrap's seed.
        min_points: The fewest subsets that get a verdict.
        alpha: The family's level.
        columns: The criteria compared, the baseline among them, or None for ``lab_criteria()``.

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
        statistics = [_predictor_statistics(verdict_rows, runs, p, **options) for p in names]
        results.append(LabResult(table, statistics, _single_component_agreement(table), budget, n_boot=n_boot))
    _judge_family(results, alpha)
    return results


def write_lab(results: list[LabResult], out: Path) -> list[Path]:
    """Write the lab's predictor, subset and agreement tables into ``out`` and return their paths."""
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
