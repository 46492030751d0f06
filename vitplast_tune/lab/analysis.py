"""Compute one lab's figures under the pre-registered design; only the pooled labs get verdicts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from vitplast_tune.analysis import crossed
from vitplast_tune.analysis.bootstrap import MAX_DEGENERATE
from vitplast_tune.analysis.correlation import spearman
from vitplast_tune.analysis.multiple import defined, percentile_interval
from vitplast_tune.analysis.subsets import subset_table
from vitplast_tune.analysis.subsets_report import describe_subsets
from vitplast_tune.analysis.verdicts import format_mc, quantile_se
from vitplast_tune.components import BLOCK_COMPONENTS
from vitplast_tune.lab.design import Design
from vitplast_tune.lab.records import LabRecords

SUBSETS, SINGLES = "subsets", "single components"


@dataclass
class Difference:
    """Hold a predictor's Spearman minus the baseline's on one lab's rows, observed and on each resample."""

    predictor: str
    what: str
    n: int
    spearman: float = math.nan
    baseline_spearman: float = math.nan
    samples: np.ndarray | None = None
    note: str = ""

    @property
    def estimate(self) -> float:
        return self.spearman - self.baseline_spearman

    @property
    def se(self) -> float:
        """Return the bootstrap standard deviation of the difference where it is defined."""
        values = defined(self.samples)
        return float(np.std(values)) if len(values) > 1 else math.nan

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        return percentile_interval(self.samples, level) if self.samples is not None else (math.nan, math.nan)


@dataclass
class LabAnalysis:
    """Hold a lab's table of subsets at their best rates and its differences, on ``n_boot`` crossed resamples.

    Attributes:
        records: The kept lab.
        table: Each subset at its best rate, its predictors, and whether it is in the verdict.
        differences: Each predictor's difference over the subsets in the verdict.
        singles: The same on the single block components.
        n_boot: The crossed resamples.
        notes: What the lab's records lack, and where it falls short of the design.
    """

    records: LabRecords
    table: pd.DataFrame
    differences: list[Difference]
    singles: list[Difference]
    n_boot: int
    notes: list[str] = field(default_factory=list)

    def difference(self, predictor: str, what: str = SUBSETS) -> Difference | None:
        """Return one predictor's difference.

        Args:
            predictor: The predictor.
            what: ``SUBSETS`` or ``SINGLES``.

        Returns:
            Its difference, or None when the lab has none.
        """
        found = [d for d in (self.differences if what == SUBSETS else self.singles) if d.predictor == predictor]
        return found[0] if found else None


def _difference(
    predictor: str, what: str, x: np.ndarray, base: np.ndarray, y: np.ndarray, drawn: np.ndarray, values: np.ndarray
) -> Difference:
    """Compute the predictor's difference to the baseline against ``y``, observed and on each resample."""
    found = Difference(predictor, what, len(x))
    if len(x) < 3 or len(np.unique(x)) < 2:
        found.note = "too few rows (n < 3)" if len(x) < 3 else "the predictor is constant"
        return found
    found.spearman, found.baseline_spearman = spearman(x, y), spearman(base, y)
    samples = spearman(x[drawn], values) - spearman(base[drawn], values)
    if np.mean(~np.isfinite(samples)) > MAX_DEGENERATE:
        found.note = "undetermined (the difference is undefined on too many resamples)"
        return found
    found.samples = samples
    return found


def analyze_lab(
    records: LabRecords, design: Design, *, n_boot: int | None = None, draw_subsets: bool = True
) -> LabAnalysis:
    """Compute a kept lab's subsets table and each predictor's difference to the baseline under ``design``.

    Args:
        records: The kept lab.
        design: The pre-registered design.
        n_boot: The number of resamples, or None for the design's.
        draw_subsets: Whether each resample draws the subsets too, as the pooled verdict does.

    Returns:
        The lab's analysis.

    Raises:
        UserError: If the design does not name the lab's model or task.
    """
    design.check_lab(records.name, records.model, records.task)
    n_boot = n_boot or design.resamples
    columns = tuple(dict.fromkeys([*design.predictors, design.baseline]))
    trials = records.trials.reset_index(drop=True)
    table = subset_table(trials.assign(best_val_acc=trials[records.select]), records.extra, columns=columns)
    rows = table[table["in_verdict"]].reset_index(drop=True)
    notes = list(records.notes)
    if records.seeds < design.seeds:
        notes.append(f"{records.seeds} seeds per configuration, fewer than the design's {design.seeds}")
    correct = records.correct if design.test_images_joint else None
    grid = crossed.grid_of(trials, list(rows["components"]), select=records.select, correct=correct)
    drawn, values = crossed.targets(
        grid, n_boot, crossed.stream(records.name, design.bootstrap_seed), draw_subsets=draw_subsets
    )
    y = crossed.point(grid)
    judged = [p for p in columns if p != design.baseline]
    differences = [_column_difference(rows, p, design.baseline, SUBSETS, y, drawn, values) for p in judged]
    singles = [c for c in BLOCK_COMPONENTS if c in set(rows["components"])]
    single_rows = rows.set_index("components").loc[singles].reset_index()
    grid = grid.rows(singles)
    stream = crossed.stream(records.name + ":single", design.bootstrap_seed)
    drawn, values = crossed.targets(grid, n_boot, stream, draw_subsets=False)
    y = crossed.point(grid)
    narrower = [_column_difference(single_rows, p, design.baseline, SINGLES, y, drawn, values) for p in judged]
    return LabAnalysis(records, table, differences, narrower, n_boot, notes)


def _column_difference(rows: pd.DataFrame, predictor: str, baseline: str, what: str, y, drawn, values) -> Difference:
    if predictor not in rows or baseline not in rows:
        return Difference(predictor, what, 0, note="not measured in this lab")
    x, base = (pd.to_numeric(rows[c], errors="coerce").to_numpy(float) for c in (predictor, baseline))
    keep = np.isfinite(x) & np.isfinite(base)
    if not keep.all():
        return Difference(predictor, what, int(keep.sum()), note="not measured on every row")
    return _difference(predictor, what, x, base, y, drawn, values)


def _describe_differences(analysis: LabAnalysis, what: str = SUBSETS) -> str:
    """Describe each predictor's Spearman and its difference to the baseline with a 95% interval."""
    found = analysis.differences if what == SUBSETS else analysis.singles
    lines = []
    for d in found:
        if d.note:
            lines.append(f"  {d.predictor:<22} n={d.n}: {d.note}")
            continue
        low, high = d.interval()
        se = max(quantile_se(d.samples, 0.025), quantile_se(d.samples, 0.975))
        lines.append(
            f"  {d.predictor:<22} n={d.n:<3} Spearman {d.spearman:+.2f} (baseline {d.baseline_spearman:+.2f})  "
            f"diff {d.estimate:+.2f} [{format_mc(low, se)}, {format_mc(high, se)}] (95%, SE {d.se:.2f})"
        )
    return "\n".join(lines)


def describe_lab(analysis: LabAnalysis) -> str:
    """Describe a lab's analysis as text, with what its records lack.

    Args:
        analysis: The lab's analysis.

    Returns:
        The text.
    """
    r = analysis.records
    head = [f"Lab {r.name}: {r.model} on {r.task} ({r.dataset}), {len(r.trials)} trials, {r.seeds} seeds."]
    head += [f"  Note: {n}." for n in analysis.notes]
    return "\n".join(
        [
            *head,
            "",
            "Each subset at its best rate (mean validation accuracy over seeds), test accuracy there:",
            _describe_subsets_table(analysis),
            "",
            f"Each predictor's Spearman minus the baseline's over the subsets in the verdict (crossed bootstrap, "
            f"{analysis.n_boot} resamples of the subsets, the seeds and the test images; figures only, the verdicts are "
            "the pooled family's):",
            _describe_differences(analysis, SUBSETS),
            "",
            "The same on the single block components (seeds and test images resampled, the components kept):",
            _describe_differences(analysis, SINGLES),
        ]
    )


def _describe_subsets_table(analysis: LabAnalysis) -> str:
    """Describe the subsets' table as the lab prints it."""
    from vitplast_tune.analysis.subsets import LabResult

    return describe_subsets(LabResult(analysis.table, [], {}))
