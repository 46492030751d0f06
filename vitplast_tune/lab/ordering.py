"""Test the paper's practical claim on the kept labs, outside the pre-registered family.

Finetuned alone, do mha, fc1 and fc2 beat ln1 and ln2, and does plasticity order them better than parameter count?
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

import numpy as np
import pandas as pd

from vitplast_tune.analysis import crossed
from vitplast_tune.analysis.correlation import spearman
from vitplast_tune.analysis.multiple import percentile_interval
from vitplast_tune.components import ALL, HEAD, subset_name
from vitplast_tune.lab.pooled import BASELINE_WORDS
from vitplast_tune.lab.records import LabRecords

AHEAD, BEHIND = ("mha", "fc1", "fc2"), ("ln1", "ln2")
SHOWN = (*AHEAD, *BEHIND, ALL, HEAD)  # the table shows the five block components, full finetuning and the head
SCORE = "plasticity_mean"  # the paper's plasticity
LABELS = {ALL: "full"}  # the table renames these
LEVEL = 0.95


@dataclass
class Gap:
    """Hold one lab's or check's single components, by name, and the gap between ``AHEAD`` and ``BEHIND``."""

    lab: str
    model: str
    task: str
    accuracy: dict[str, float]  # mean test accuracy over the seeds at the rate chosen on validation
    plasticity: dict[str, float]
    params: dict[str, float]
    gap: float
    samples: np.ndarray | None = None  # the gap on each crossed resample

    def interval(self, level: float = LEVEL) -> tuple[float, float]:
        return percentile_interval(self.samples, level) if self.samples is not None else (math.nan, math.nan)


def gap_of(records: LabRecords, *, n_boot: int = 0, seed: int = 0) -> Gap | None:
    """Measure a lab's single components and their gap with ``n_boot`` resamples, or None if some are missing."""
    trials = records.trials
    names = pd.Series([subset_name(c) for c in trials["components"]], index=trials.index)
    if not set(AHEAD + BEHIND) <= set(names):
        return None
    keys = [k for k in SHOWN if k in set(names)]
    grid = crossed.grid_of(trials, keys, select=records.select, correct=records.correct)
    accuracy = dict(zip(keys, crossed.point(grid).tolist()))
    first = trials.groupby(names).first()
    column = lambda c: {k: float(first[c].get(k, math.nan)) if c in first else math.nan for k in keys}
    found = Gap(records.name, records.model, records.task, accuracy, column(SCORE), column("trainable_params"), 0.0)
    found.gap = float(np.mean([accuracy[k] for k in AHEAD]) - np.mean([accuracy[k] for k in BEHIND]))
    if n_boot:
        stream = crossed.stream(records.name + ":ordering", seed)
        _, values = crossed.targets(grid.rows([*AHEAD, *BEHIND]), n_boot, stream, draw_subsets=False)
        found.samples = values[:, : len(AHEAD)].mean(axis=1) - values[:, len(AHEAD) :].mean(axis=1)
    return found


def checks_gaps(checks: list[LabRecords]) -> tuple[list[Gap], int]:
    """Return the gaps of the checks that were not saturated, and how many such checks there are."""
    open_checks = [r for r in checks if not _saturated(r.record.get("qualification", {}))]
    return [g for r in open_checks if (g := gap_of(r)) is not None], len(open_checks)


def _saturated(q: dict) -> bool:
    full, threshold = q.get("full", {}).get("mean", math.nan), q.get("max_full_val_acc", math.nan)
    return bool(full >= threshold)


@dataclass
class Ordering:
    """Hold the gap over the labs and checks, and how plasticity and parameter count order the components."""

    labs: list[Gap]
    checks: list[Gap]  # the non-saturated checks' gaps
    open_checks: int
    gap: float  # the labs' mean gap, with its interval at LEVEL
    low: float
    high: float
    pairs: pd.DataFrame  # the sign of accuracy, plasticity and parameter count per (ahead, behind) pair and lab
    spearman: pd.DataFrame  # each score's Spearman with accuracy per lab

    @property
    def positive(self) -> int:
        return sum(g.gap > 0 for g in self.labs)

    @property
    def excluding_zero(self) -> int:
        return sum(g.interval()[0] > 0 or g.interval()[1] < 0 for g in self.labs)

    def agree(self, score: str) -> int:
        """Count the pairs over the labs that ``score`` orders as accuracy does."""
        return int(((self.pairs[score] == self.pairs["accuracy"]) & (self.pairs["accuracy"] != 0)).sum())


def ordering(labs: list[Gap], checks: list[Gap], open_checks: int) -> Ordering:
    """Pool the resampled gap over ``labs`` and order each (ahead, behind) pair by each score."""
    samples = np.vstack([g.samples for g in labs]).mean(axis=0)
    low, high = percentile_interval(samples, LEVEL)
    pairs, ranks, keys = [], [], [*AHEAD, *BEHIND]
    for g in labs:
        for a, b in product(AHEAD, BEHIND):
            sign = {"accuracy": g.accuracy, "plasticity": g.plasticity, "params": g.params}
            pairs.append({"lab": g.lab, "ahead": a, "behind": b} | {k: np.sign(v[a] - v[b]) for k, v in sign.items()})
        y = np.array([g.accuracy[k] for k in keys])
        x = {s: np.array([getattr(g, s)[k] for k in keys]) for s in ("plasticity", "params")}
        ranks.append({"lab": g.lab} | {s: spearman(v, y) for s, v in x.items()})
    gap = float(np.mean([g.gap for g in labs]))
    return Ordering(labs, checks, open_checks, gap, low, high, pd.DataFrame(pairs), pd.DataFrame(ranks))


def _points(value: float) -> str:
    return f"{100 * value:+.2f}"


def finding(o: Ordering) -> str:
    """Say the single-component result in the one sentence that the README quotes."""
    n = len(o.labs)
    beat = (
        "beat" if o.low > 0 and o.positive == n else "beat, on the labs' mean but not in every lab," if o.low > 0
        else "are not shown to beat"
    )  # fmt: skip
    plast, params, total = o.agree("plasticity"), o.agree("params"), len(o.pairs)
    better = (
        "parameter count orders them better than plasticity does" if params > plast
        else "plasticity orders them better than parameter count does" if plast > params
        else "plasticity and parameter count order them alike"
    )  # fmt: skip
    checks = sum(g.gap > 0 for g in o.checks)
    return (
        f"Exploratory, outside the pre-registered family: finetuned alone, {', '.join(AHEAD[:-1])} and {AHEAD[-1]} "
        f"{beat} {' and '.join(BEHIND)} ({_points(o.gap)} points [{_points(o.low)}, {_points(o.high)}] on the labs' "
        f"mean, positive in {o.positive} of {n} labs and in {checks} of {o.open_checks} non-saturated checks); "
        f"{better} (parameter count agrees with accuracy on {params} of {total} (mha/fc, ln) pairs, {SCORE} on "
        f"{plast})."
    )


def contradiction(o: Ordering) -> str:
    """Name the pair that plasticity orders against accuracy in the most labs, or return ""."""
    p = o.pairs
    against = p[(p["plasticity"] < 0) & (p["accuracy"] > 0)].groupby(["ahead", "behind"]).size()
    if against.empty:
        return ""
    a, b = against.idxmax()
    pair = p[(p["ahead"] == a) & (p["behind"] == b)]
    n = len(o.labs)
    less, more = int((pair["plasticity"] < 0).sum()), int((pair["accuracy"] > 0).sum())
    return f"{a} is less plastic than {b} in {less} of {n} labs yet more accurate in {more} of {n}"


def _bracket(value: float) -> str:
    return f" ({value:.2f})" if math.isfinite(value) else ""


def describe(o: Ordering) -> list[str]:
    """Write the page's lines: the finding, the table per lab, the checks and the orderings."""
    keys = [k for k in SHOWN if all(k in g.accuracy for g in o.labs)]
    head = [
        "| lab | " + " | ".join(LABELS.get(k, k) for k in keys) + f" | gap [{100 * LEVEL:.0f}%] |",
        "|---|" + "---|" * (len(keys) + 1),
    ]
    rows = []
    for g in o.labs:
        cells = [f"{100 * g.accuracy[k]:.2f}" + _bracket(g.plasticity[k]) for k in keys]
        low, high = g.interval()
        rows.append(f"| {g.lab} | " + " | ".join(cells) + f" | {_points(g.gap)} [{_points(low)}, {_points(high)}] |")
    params = {k: sorted({g.params[k] for g in o.labs}) for k in keys}
    sizes = ", ".join(f"{LABELS.get(k, k)} {' or '.join(f'{v:,.0f}' for v in vs)}" for k, vs in params.items())
    n, checks = len(o.labs), sum(g.gap > 0 for g in o.checks)
    qualified = {(g.model, g.task) for g in o.labs}
    other = [g for g in o.checks if (g.model, g.task) not in qualified]
    rho = o.spearman[["plasticity", "params"]].mean()
    found = contradiction(o)
    return [
        finding(o),
        "",
        f"Each component finetuned alone (full finetuning and the head for reference): test accuracy in %, mean over "
        f"the seeds at the rate chosen on validation, its {SCORE} in brackets; the gap is mean({', '.join(AHEAD)}) - "
        f"mean({', '.join(BEHIND)}) in points with its {100 * LEVEL:.0f}% crossed-bootstrap interval (seeds and test "
        f"images drawn jointly, the components kept). Trainable parameters, the head's included (its size follows the "
        f"task's classes): {sizes}.",
        "",
        *head,
        *rows,
        "",
        f"- **The gap**: positive in {o.positive} of {n} labs, its interval excluding 0 in {o.excluding_zero}; "
        f"{_points(o.gap)} points [{_points(o.low)}, {_points(o.high)}] on the labs' mean (resample by resample). On "
        f"the {o.open_checks} checks that were not saturated (point figures; the {len(o.checks) - len(other)} of the "
        f"labs' own tasks among them), positive in {checks} of {len(o.checks)}; on the {len(other)} whose task did not "
        f"qualify, in {sum(g.gap > 0 for g in other)} of {len(other)}.",
        f"- **What orders them**: of the {len(o.pairs)} (mha/fc, ln) pairs over the labs, accuracy puts the mha/fc "
        f"component ahead in {int((o.pairs['accuracy'] > 0).sum())}; parameter count orders {o.agree('params')} of "
        f"them as accuracy does, {SCORE} {o.agree('plasticity')}"
        + (f"; {found}" if found else "")
        + f". Spearman with accuracy over the five block components, the labs' mean: {SCORE} {rho['plasticity']:+.2f}, "
        f"{BASELINE_WORDS} {rho['params']:+.2f}." + (_encoded if bool((o.pairs["params"] > 0).all()) else ""),
    ]


_encoded = (
    " The pre-registered narrower claim compares these two Spearmans; since parameter count puts every one of mha, "
    "fc1 and fc2 above ln1 and ln2, it cannot test whether plasticity is why they beat them."
)
