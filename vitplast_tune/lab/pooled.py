"""The pre-registered verdict over labs (tasks, and models): every claim the design's family names, judged once.

Per lab, each predictor's Spearman difference to the baseline comes with its crossed-bootstrap values (``analysis``).
Pooled across the labs, the difference is their mean, resample by resample (each lab's own stream: the labs' order
changes nothing). Each claim of the family gets a bootstrap p-value with its Monte Carlo standard error: superiority
("better": the share of pooled values at or below 0), equivalence within the margin ("equivalent": two one-sided
tests, the larger of the shares beyond -margin and +margin), and the narrower claim on the single components against
the baseline ("narrower"); one correction over the whole family, and a corrected p within the design's Monte Carlo
errors of alpha is "undecided". Each lab's seeds and test images are drawn from its own stream, so the null needs no
independence of the tasks' true effects; but the two models' labs of one task share their test images and seed
values, a dependence these draws leave out. The pooled mean is conditional on these tasks, and the words say so.
The headline figure is the tasks' random-effects estimate (DerSimonian-Laird, ``statsmodels``) with tau^2 and I^2,
beside the number of tasks a task-level test would need under this family.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from vitplast_tune.analysis.multiple import defined, percentile_interval
from vitplast_tune.analysis.verdicts import TestResult, decision, p_se, quantile_se
from vitplast_tune.errors import UserError
from vitplast_tune.lab.analysis import SINGLES, SUBSETS, LabAnalysis
from vitplast_tune.lab.design import Claim, Design
from vitplast_tune.predictors.scores import BASELINE

BASELINE_WORDS = "log(#trainable parameters)"
WHAT = {"better": SUBSETS, "equivalent": SUBSETS, "narrower": SINGLES}


@dataclass
class Judged:
    """One claim of the family: the test's result (None when no lab could measure it) and the pooled values."""

    claim: Claim
    labs: int
    estimate: float
    samples: np.ndarray | None
    p: float = math.nan
    p_se: float = math.nan
    result: TestResult | None = None
    why_untested: str = ""  # when no lab could judge it: what the labs' differences say (not measured, undetermined)


@dataclass
class PooledResult:
    """The pooled verdict.

    Attributes:
        design: The pre-registration.
        labs: Each lab's analysis, in (model, task) order.
        per_lab: Each lab's differences: lab, model, task, predictor, what, n, diff, low, high, se, note.
        judged: Every claim of the family.
        headline: The random effects per predictor and rows: re, its interval, tau2, i2, the labs' mean.
        power: The design's power per predictor and rows, and the labs 80% would need for each claim.
        tasks_needed: The fewest tasks a task-level test needs under this family.
        excluded: Labs left out (their task did not qualify).
    """

    design: Design
    labs: list[LabAnalysis]
    per_lab: pd.DataFrame  # lab, model, task, predictor, what, n, diff, low, high, se, note
    judged: list[Judged]
    headline: pd.DataFrame  # predictor, what, labs, re, re_low, re_high, tau2, i2, fixed (the labs' mean)
    power: pd.DataFrame  # predictor, what, se_pooled, superiority, equivalence, (equivalence_)labs/task_level_80
    tasks_needed: int
    excluded: list[str] = field(default_factory=list)

    @property
    def scope(self) -> str:
        return scope_of(self.labs)

    @property
    def interim(self) -> str:
        return interim_of(self.labs, self.design)


def scope_of(labs: list[LabAnalysis]) -> str:
    """The words that hold the verdict to its tasks: "across these 4 tasks (...) on 1 model (...)"."""
    tasks = sorted({a.records.task for a in labs})
    models = sorted({a.records.model for a in labs})
    these = f"these {len(tasks)} tasks" if len(tasks) != 1 else "this 1 task"
    return f"across {these} ({', '.join(tasks)}) on {len(models)} model{'s' * (len(models) != 1)} ({', '.join(models)})"


def interim_of(labs: list[LabAnalysis], design: Design) -> str:
    """Why these labs are not the set the design judges once (``tasks_per_model`` labs on each of its models), or ""
    when they are (or the design names no number)."""
    if not design.tasks_per_model:
        return ""
    count = {short: sum(a.records.model in (short, name) for a in labs) for short, name in design.models.items()}
    if all(n == design.tasks_per_model for n in count.values()):
        return ""
    have = ", ".join(f"{short} has {n}" for short, n in count.items())
    return (
        f"these {len(labs)} labs are not the {design.tasks_per_model * len(count)} the pre-registration judges once "
        f"({design.tasks_per_model} tasks on each of its {len(count)} models; {have})"
    )


def per_lab_table(labs: list[LabAnalysis]) -> pd.DataFrame:
    """Each lab's differences as rows: lab, model, task, predictor, what, n, diff, its 95% interval, SE, note."""
    rows = []
    for a in labs:
        for d in [*a.differences, *a.singles]:
            low, high = d.interval()
            rows.append(
                {"lab": a.records.name, "model": a.records.model, "task": a.records.task, "predictor": d.predictor}
                | {"what": d.what, "n": d.n, "diff": d.estimate if not d.note else math.nan, "low": low, "high": high}
                | {"se": d.se, "note": d.note}
            )
    return pd.DataFrame(rows)


def pooled_samples(labs: list[LabAnalysis], predictor: str, what: str) -> tuple[int, float, np.ndarray | None]:
    """The labs measuring ``predictor`` on ``what``, their mean difference and its values per resample (the labs'
    mean, resample by resample; None when no lab measured it)."""
    found = [a.difference(predictor, what) for a in labs]
    found = [d for d in found if d is not None and d.samples is not None]
    if not found:
        return 0, math.nan, None
    return len(found), float(np.mean([d.estimate for d in found])), np.vstack([d.samples for d in found]).mean(axis=0)


def _p_value(kind: str, samples: np.ndarray, margin: float) -> tuple[float, float]:
    """The claim's bootstrap p-value and its Monte Carlo standard error."""
    values = defined(samples)
    if kind == "equivalent":
        p = max(float(np.mean(values <= -margin)), float(np.mean(values >= margin)))
    else:
        p = float(np.mean(values <= 0))
    return p, p_se(p, len(values))


def _corrected(
    p: np.ndarray, se: np.ndarray, method: str, alpha: float, undecided_se: float = 3.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The corrected p-values (``statsmodels`` multipletests), their Monte Carlo errors (the step's multiplier times
    the error of the p that sets it; 0 when capped at 1), each hypothesis's share of alpha for its interval, and
    whether an earlier step its rejection rests on (Holm: every smaller p, each against its own threshold
    ``alpha / (m - rank + 1)``) is within ``undecided_se`` Monte Carlo errors of that threshold."""
    from statsmodels.stats.multitest import multipletests

    m = len(p)
    adjusted = multipletests(p, method=method)[1] if m else np.array([])
    order = np.argsort(p, kind="stable")
    multiplier = (m - np.arange(m)) if method == "holm" else np.full(m, m)
    stepped = multiplier * p[order]
    setter = np.array([int(np.argmax(stepped[: k + 1])) for k in range(m)])
    errors = np.empty(m)
    errors[order] = multiplier[setter] * se[order][setter]
    errors[adjusted >= 1] = 0.0  # capped at 1: no resample moves it
    near = np.abs(stepped - alpha) <= undecided_se * multiplier * se[order]  # each step against its threshold
    earlier = np.zeros(m, dtype=bool)
    earlier[order] = np.logical_or.accumulate(near) if method == "holm" else near
    shares = np.full(m, 1 / max(m, 1))  # not rejected: Bonferroni's share (its interval then holds the null value)
    steps = np.empty(m)
    steps[order] = 1 / multiplier
    rejected = adjusted < alpha
    shares[rejected] = steps[rejected]  # rejected: its own step's share (its interval then excludes the null value)
    for value in np.unique(p[rejected]):  # equal p's (predictors that rank alike): the first one's step, for each
        tied = rejected & (p == value)
        shares[tied] = shares[tied].min()
    return adjusted, errors, shares, earlier


def judge(labs: list[LabAnalysis], design: Design) -> list[Judged]:
    """Every claim of the design's family on the pooled values, under one correction."""
    judged = []
    for claim in design.family:
        n, estimate, samples = pooled_samples(labs, claim.predictor, WHAT[claim.claim])
        found = Judged(claim, n, estimate, samples)
        if samples is not None:
            found.p, found.p_se = _p_value(claim.claim, samples, design.margin)
        else:
            notes = [d.note for a in labs if (d := a.difference(claim.predictor, WHAT[claim.claim])) is not None]
            found.why_untested = "; ".join(dict.fromkeys(n for n in notes if n)) or "not measured in any lab"
        judged.append(found)
    tested = [j for j in judged if math.isfinite(j.p)]
    p, se = np.array([j.p for j in tested]), np.array([j.p_se for j in tested])
    adjusted, errors, shares, earlier = _corrected(p, se, design.correction, design.alpha, design.undecided_mc_se)
    scope = scope_of(labs)
    for j, q, q_se, share, near in zip(tested, adjusted, errors, shares, earlier):
        level = 1 - 2 * design.alpha * share  # two-sided at twice the one-sided share: TOST's interval
        low, high = percentile_interval(j.samples, level)
        tail = (1 - level) / 2
        interval_se = max(quantile_se(j.samples, tail), quantile_se(j.samples, 1 - tail))
        kind = "better" if j.claim.claim == "narrower" else j.claim.claim
        what = "the single block components" if j.claim.claim == "narrower" else "the subsets"
        j.result = TestResult(
            claim=kind, subject=j.claim.predictor, baseline=BASELINE_WORDS, what=what, estimate=j.estimate,
            low=low, high=high, level=level, p=j.p, p_se=j.p_se, p_adjusted=float(q), p_adjusted_se=float(q_se),
            alpha=design.alpha, correction=design.correction, family=len(tested), margin=design.margin,
            interval_se=interval_se, scope=scope, undecided_se=design.undecided_mc_se, earlier_undecided=bool(near),
        )  # fmt: skip
    return judged


def random_effects(diffs: np.ndarray, ses: np.ndarray) -> dict:
    """DerSimonian-Laird random-effects pooling of per-lab differences with their bootstrap standard errors
    (``statsmodels.stats.meta_analysis.combine_effects``): the estimate, its 95% interval, tau^2 and I^2."""
    keep = np.isfinite(diffs) & np.isfinite(ses) & (ses > 0)
    out = {"labs": int(keep.sum()), "re": math.nan, "re_low": math.nan, "re_high": math.nan, "tau2": math.nan}
    out["i2"] = math.nan
    if keep.sum() < 2:
        return out
    from statsmodels.stats.meta_analysis import combine_effects

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # its HKSJ figures (not used) take a root of a negative scale
        res = combine_effects(diffs[keep], ses[keep] ** 2, method_re="dl")
        intervals = res.conf_int(alpha=0.05, use_t=False)  # (fixed, random effects, ...)
    if res.tau2 > 0:
        estimate, (low, high) = res.mean_effect_re, intervals[1]
    else:  # DerSimonian-Laird's tau^2 truncated at 0 (statsmodels leaves it negative): the fixed-effect pooling
        estimate, (low, high) = res.mean_effect_fe, intervals[0]
    return (
        out
        | {"re": float(estimate), "re_low": float(low), "re_high": float(high)}
        | {
            "tau2": max(0.0, float(res.tau2)),
            "i2": max(0.0, float(res.i2)),  # (Q - df) / Q, truncated at 0 as I^2 is reported
        }
    )


def headline(per_lab: pd.DataFrame) -> pd.DataFrame:
    """Per predictor and rows (subsets, single components): the random-effects estimate over the labs, tau^2, I^2."""
    rows = []
    for (predictor, what), part in per_lab.groupby(["predictor", "what"], sort=False):
        effects = random_effects(part["diff"].to_numpy(float), part["se"].to_numpy(float))
        rows.append({"predictor": predictor, "what": what, "fixed": float(part["diff"].mean())} | effects)
    return pd.DataFrame(rows)


def tasks_needed(alpha: float, family: int) -> int:
    """The fewest tasks for which a task-level test (signs flipped over tasks, one-sided) can reach the family's
    strictest threshold: its smallest p, 1 / 2^N, below alpha / family."""
    return int(math.floor(math.log2(max(family, 1) / alpha))) + 1


def power_table(per_lab: pd.DataFrame, heads: pd.DataFrame, design: Design, family: int) -> pd.DataFrame:
    """The design's power at the strictest threshold (alpha / family), by a normal approximation from the labs'
    bootstrap errors: to show "better" when the true difference is the margin, to show equivalence when it is 0 (both
    conditional on the tasks), and the labs each would need for 80% (conditional; and task-level, with tau^2):
    ``(z + z_0.8)^2 var / margin^2`` for "better", ``(z + z_0.9)^2 var / margin^2`` for equivalence (two one-sided
    tests at a true 0 reach 80% when each side's power is 90%)."""
    z = stats.norm.ppf(1 - design.alpha / max(family, 1))
    z80, z90 = stats.norm.ppf(0.8), stats.norm.ppf(0.9)
    rows = []
    for h in heads.itertuples():
        part = per_lab[(per_lab["predictor"] == h.predictor) & (per_lab["what"] == h.what)]
        var = float(np.nanmean(part["se"] ** 2)) if part["se"].notna().any() else math.nan
        n = int(part["se"].notna().sum())
        if not (n and math.isfinite(var) and var > 0):
            continue
        se = math.sqrt(var / n)
        tau2 = h.tau2 if math.isfinite(h.tau2) else 0.0
        rows.append(
            {"predictor": h.predictor, "what": h.what, "labs": n, "se_pooled": se}
            | {"superiority": float(stats.norm.cdf(design.margin / se - z))}
            | {"equivalence": max(0.0, float(2 * stats.norm.cdf(design.margin / se - z) - 1))}
            | {"labs_for_80": math.ceil(((z + z80) ** 2) * var / design.margin**2)}
            | {"task_level_80": math.ceil(((z + z80) ** 2) * (var + tau2) / design.margin**2)}
            | {"equivalence_labs_for_80": math.ceil(((z + z90) ** 2) * var / design.margin**2)}
            | {"equivalence_task_level_80": math.ceil(((z + z90) ** 2) * (var + tau2) / design.margin**2)}
        )
    return pd.DataFrame(rows)


def pool(labs: list[LabAnalysis], design: Design) -> PooledResult:
    """The pre-registered verdict over ``labs``.

    Args:
        labs: each lab's analysis under ``design`` (``analysis.analyze_lab``).
        design: the pre-registration.

    Returns:
        The family judged, the random-effects headline, the power and the tasks a task-level test needs.

    Raises:
        UserError: no lab, or two labs of the same model and task.
    """
    if not labs:
        raise UserError("no lab to pool")
    labs = sorted(labs, key=lambda a: (a.records.model, a.records.task, a.records.name))  # the order named: no matter
    seen = [(a.records.model, a.records.task) for a in labs]
    if len(set(seen)) < len(seen):
        raise UserError("two labs of the same model and task: pool each model x task once")
    per_lab = per_lab_table(labs)
    judged = judge(labs, design)
    family = sum(j.result is not None for j in judged)
    heads = headline(per_lab)
    power = power_table(per_lab, heads, design, family)
    return PooledResult(design, labs, per_lab, judged, heads, power, tasks_needed(design.alpha, family))


def verdict_of(result: PooledResult, predictor: str, claim: str = "better") -> str:
    """A predictor's decision on one claim ("established", "undecided", "not established"; "" when not in the family)."""
    for j in result.judged:
        if j.claim.predictor == predictor and j.claim.claim == claim:
            return decision(j.result) if j.result is not None else "not tested"
    return ""


__all__ = ["PooledResult", "pool", "judge", "random_effects", "tasks_needed", "verdict_of", "BASELINE"]
