"""Pool the labs' differences and judge every claim of the pre-registered family once, under one correction."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from vitplast_tune.analysis.multiple import defined, percentile_interval
from vitplast_tune.analysis.verdicts import TestResult, p_se, quantile_se
from vitplast_tune.errors import UserError
from vitplast_tune.lab.analysis import SINGLES, SUBSETS, LabAnalysis
from vitplast_tune.lab.design import Claim, Design

BASELINE_WORDS = "log(#trainable parameters)"
WHAT = {"better": SUBSETS, "equivalent": SUBSETS, "narrower": SINGLES}


@dataclass
class Judged:
    """Hold one claim of the family with its pooled values and its test's result, None when no lab measured it."""

    claim: Claim
    labs: int
    estimate: float
    samples: np.ndarray | None
    p: float = math.nan
    p_se: float = math.nan
    result: TestResult | None = None
    why_untested: str = ""  # what the labs' differences say when no lab could judge the claim


@dataclass
class PooledResult:
    """Hold the pooled verdict.

    Attributes:
        design: The pre-registration.
        labs: Each lab's analysis, in (model, task) order.
        per_lab: Each lab's differences with their intervals.
        judged: Every claim of the family.
        headline: The random-effects estimate per predictor and rows, with tau^2 and I^2.
        power: The design's power per predictor and rows, and the labs that 80% power would need.
        tasks_needed: The fewest tasks a task-level test needs under this family.
        excluded: Labs left out because their task did not qualify.
    """

    design: Design
    labs: list[LabAnalysis]
    per_lab: pd.DataFrame
    judged: list[Judged]
    headline: pd.DataFrame
    power: pd.DataFrame
    tasks_needed: int
    excluded: list[str] = field(default_factory=list)

    @property
    def scope(self) -> str:
        return _scope_of(self.labs)

    @property
    def interim(self) -> str:
        return _interim_of(self.labs, self.design)


def _scope_of(labs: list[LabAnalysis]) -> str:
    """Word the verdict's scope, such as "across these 4 tasks (...) on 1 model (...)"."""
    tasks = sorted({a.records.task for a in labs})
    models = sorted({a.records.model for a in labs})
    these = f"these {len(tasks)} tasks" if len(tasks) != 1 else "this 1 task"
    return f"across {these} ({', '.join(tasks)}) on {len(models)} model{'s' * (len(models) != 1)} ({', '.join(models)})"


def _interim_of(labs: list[LabAnalysis], design: Design) -> str:
    """Say why these labs are not the set the design judges once, or "" when they are."""
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


def _per_lab_table(labs: list[LabAnalysis]) -> pd.DataFrame:
    """Tabulate each lab's differences with their 95% intervals."""
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


def _pooled_samples(labs: list[LabAnalysis], predictor: str, what: str) -> tuple[int, float, np.ndarray | None]:
    """Return how many labs measured ``predictor``, their mean difference, and its mean on each resample."""
    found = [a.difference(predictor, what) for a in labs]
    found = [d for d in found if d is not None and d.samples is not None]
    if not found:
        return 0, math.nan, None
    return len(found), float(np.mean([d.estimate for d in found])), np.vstack([d.samples for d in found]).mean(axis=0)


def _p_value(kind: str, samples: np.ndarray, margin: float) -> tuple[float, float]:
    """Return the claim's bootstrap p-value and its Monte Carlo standard error."""
    values = defined(samples)
    if kind == "equivalent":
        p = max(float(np.mean(values <= -margin)), float(np.mean(values >= margin)))
    else:
        p = float(np.mean(values <= 0))
    return p, p_se(p, len(values))


def _corrected(
    p: np.ndarray, se: np.ndarray, method: str, alpha: float, undecided_se: float = 3.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Correct the p-values and return them with their Monte Carlo errors, alpha shares and undecided earlier steps.

    An earlier step is undecided when a smaller p lies within ``undecided_se`` errors of its own Holm threshold.
    """
    from statsmodels.stats.multitest import multipletests

    m = len(p)
    adjusted = multipletests(p, method=method)[1] if m else np.array([])
    order = np.argsort(p, kind="stable")
    multiplier = (m - np.arange(m)) if method == "holm" else np.full(m, m)
    stepped = multiplier * p[order]
    setter = np.array([int(np.argmax(stepped[: k + 1])) for k in range(m)])
    errors = np.empty(m)
    errors[order] = multiplier[setter] * se[order][setter]
    errors[adjusted >= 1] = 0.0  # no resample moves a p capped at 1
    near = np.abs(stepped - alpha) <= undecided_se * multiplier * se[order]  # each step against its threshold
    earlier = np.zeros(m, dtype=bool)
    earlier[order] = np.logical_or.accumulate(near) if method == "holm" else near
    shares = np.full(m, 1 / max(m, 1))  # Bonferroni's share, so a kept null lies inside its interval
    steps = np.empty(m)
    steps[order] = 1 / multiplier
    rejected = adjusted < alpha
    shares[rejected] = steps[rejected]  # its own step's share, so a rejected null lies outside its interval
    for value in np.unique(p[rejected]):  # predictors that rank alike share the first one's step
        tied = rejected & (p == value)
        shares[tied] = shares[tied].min()
    return adjusted, errors, shares, earlier


def _judge(labs: list[LabAnalysis], design: Design) -> list[Judged]:
    """Judge every claim of the design's family on the pooled values, under one correction."""
    judged = []
    for claim in design.family:
        n, estimate, samples = _pooled_samples(labs, claim.predictor, WHAT[claim.claim])
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
    scope = _scope_of(labs)
    for j, q, q_se, share, near in zip(tested, adjusted, errors, shares, earlier):
        level = 1 - 2 * design.alpha * share  # TOST's interval: two-sided at twice the one-sided share
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


def _random_effects(diffs: np.ndarray, ses: np.ndarray) -> dict:
    """Pool per-lab differences by DerSimonian-Laird random effects, with a 95% interval, tau^2 and I^2."""
    keep = np.isfinite(diffs) & np.isfinite(ses) & (ses > 0)
    out = {"labs": int(keep.sum()), "re": math.nan, "re_low": math.nan, "re_high": math.nan, "tau2": math.nan}
    out["i2"] = math.nan
    if keep.sum() < 2:
        return out
    from statsmodels.stats.meta_analysis import combine_effects

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the unused HKSJ figures take a root of a negative scale
        res = combine_effects(diffs[keep], ses[keep] ** 2, method_re="dl")
        intervals = res.conf_int(alpha=0.05, use_t=False)  # fixed effect first, then random effects
    if res.tau2 > 0:
        estimate, (low, high) = res.mean_effect_re, intervals[1]
    else:  # tau^2 truncated at 0 makes the fixed-effect pooling; statsmodels leaves it negative
        estimate, (low, high) = res.mean_effect_fe, intervals[0]
    return (
        out
        | {"re": float(estimate), "re_low": float(low), "re_high": float(high)}
        | {
            "tau2": max(0.0, float(res.tau2)),
            "i2": max(0.0, float(res.i2)),  # I^2 is (Q - df) / Q, reported truncated at 0
        }
    )


def _headline(per_lab: pd.DataFrame) -> pd.DataFrame:
    """Tabulate the random-effects estimate over the labs per predictor and rows."""
    rows = []
    for (predictor, what), part in per_lab.groupby(["predictor", "what"], sort=False):
        effects = _random_effects(part["diff"].to_numpy(float), part["se"].to_numpy(float))
        rows.append({"predictor": predictor, "what": what, "fixed": float(part["diff"].mean())} | effects)
    return pd.DataFrame(rows)


def tasks_needed(alpha: float, family: int) -> int:
    """Return the fewest tasks whose sign-flip test can reach p = 1 / 2^N below alpha / family."""
    return int(math.floor(math.log2(max(family, 1) / alpha))) + 1


def _power_table(per_lab: pd.DataFrame, heads: pd.DataFrame, design: Design, family: int) -> pd.DataFrame:
    """Approximate the design's power at alpha / family, and the labs that 80% power would need.

    Superiority assumes a true difference of the margin and equivalence a true 0. Equivalence needs 90% per side.
    """
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
    """Judge the pre-registered family over ``labs``.

    Args:
        labs: Each lab's analysis under ``design``.
        design: The pre-registration.

    Returns:
        The family judged, the random-effects headline, the power and the tasks a task-level test needs.

    Raises:
        UserError: If there is no lab, or two labs share a model and task.
    """
    if not labs:
        raise UserError("no lab to pool")
    labs = sorted(
        labs, key=lambda a: (a.records.model, a.records.task, a.records.name)
    )  # the given order never matters
    seen = [(a.records.model, a.records.task) for a in labs]
    if len(set(seen)) < len(seen):
        raise UserError("two labs of the same model and task: pool each model x task once")
    per_lab = _per_lab_table(labs)
    judged = _judge(labs, design)
    family = sum(j.result is not None for j in judged)
    heads = _headline(per_lab)
    power = _power_table(per_lab, heads, design, family)
    return PooledResult(design, labs, per_lab, judged, heads, power, tasks_needed(design.alpha, family))
