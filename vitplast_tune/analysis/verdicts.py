"""Turn a test result into the sentence every report prints, taking every word from the numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CORRECTIONS = {"holm": "Holm", "bonferroni": "Bonferroni"}  # statsmodels' names and how they print
ESTABLISHED, NOT_ESTABLISHED, UNDECIDED = "established", "not established", "undecided"


@dataclass(frozen=True)
class TestResult:
    """Hold one tested claim with its estimate, interval, p-values and family.

    Attributes:
        claim: What is claimed: "better", "equivalent", "worse" or "agrees".
        subject: What the claim is about.
        baseline: What the subject is compared with.
        what: The quantity compared.
        estimate: The estimate.
        low: The interval's lower end.
        high: The interval's upper end.
        level: The interval's confidence level.
        p: The p-value.
        p_se: Its Monte Carlo standard error, 0 when exact.
        p_adjusted: The p-value corrected for the family.
        p_adjusted_se: Its Monte Carlo standard error, 0 when exact.
        alpha: The family's level.
        correction: The family's correction for multiple tests.
        family: How many hypotheses the family holds.
        margin: The margin of an equivalence claim.
        interval_se: The Monte Carlo error of the interval's ends.
        scope: Where the claim holds, such as "across these 4 tasks".
        undecided_se: How many Monte Carlo standard errors from ``alpha`` leave the claim undecided.
        earlier_undecided: Whether an earlier Holm step that this claim rests on is undecided.
    """

    claim: str
    subject: str
    baseline: str
    what: str
    estimate: float
    low: float
    high: float
    level: float
    p: float
    p_se: float
    p_adjusted: float
    p_adjusted_se: float
    alpha: float
    correction: str
    family: int
    margin: float = math.nan
    interval_se: float = math.nan
    scope: str = ""
    undecided_se: float = 3.0
    earlier_undecided: bool = False


def decision(result: TestResult) -> str:
    """Decide a claim: "established", "undecided" within the Monte Carlo errors of alpha, or "not established"."""
    p, se = result.p_adjusted, result.p_adjusted_se
    if not math.isfinite(p):
        return NOT_ESTABLISHED
    if p < result.alpha and result.earlier_undecided:
        return UNDECIDED
    if abs(p - result.alpha) <= result.undecided_se * (se if math.isfinite(se) else 0.0):
        return UNDECIDED
    return ESTABLISHED if p < result.alpha else NOT_ESTABLISHED


def quantile_se(samples, q: float) -> float:
    """Estimate the Monte Carlo standard error of the ``q`` quantile of bootstrap values from order statistics."""
    values = np.sort(np.asarray(samples if samples is not None else [], dtype=float))
    values = values[np.isfinite(values)]
    if len(values) < 2:
        return math.nan
    k, d = q * (len(values) - 1), math.sqrt(len(values) * q * (1 - q))
    low, high = int(max(0, math.floor(k - d))), int(min(len(values) - 1, math.ceil(k + d)))
    return float(values[high] - values[low]) / 2


def p_se(p: float, n: int) -> float:
    """Return the Monte Carlo standard error of a share ``p`` of ``n`` resamples, one resample's share at 0 or 1."""
    if not math.isfinite(p) or n <= 0:
        return math.nan
    return math.sqrt(p * (1 - p) / n) if 0 < p < 1 else 1 / n


def _mc_decimals(se: float, most: int = 4) -> int:
    """Return the decimals whose last digit is worth at least 5 standard errors, so a rerun moves it by one unit."""
    if not math.isfinite(se) or se <= 0:
        return most
    return max(0, min(most, math.floor(-math.log10(5 * se))))


def format_mc(value: float, se: float, *, most: int = 2, signed: bool = True) -> str:
    """Write ``value`` to the decimals its Monte Carlo error allows, at most ``most``, such as "+0.2"."""
    if not math.isfinite(value):
        return "nan"
    return f"{value:{'+' if signed else ''}.{_mc_decimals(se, most)}f}"


def format_p(p: float, se: float) -> str:
    """Write a p-value with its Monte Carlo standard error, such as "0.01 (MC SE 0.0008)", or exact to 3 digits."""
    if not math.isfinite(p):
        return "nan"
    if not math.isfinite(se) or se == 0:
        return f"{p:.3g}"
    return f"{format_mc(p, se, most=4, signed=False)} (MC SE {se:.1g})"


def family_clause(alpha: float, correction: str, family: int) -> str:
    """Name the family a verdict was judged in, such as "Holm over 17 verdicts, family-wise 5%"."""
    name = CORRECTIONS.get(correction, correction)
    return f"{name} over {family} verdict{'s' if family != 1 else ''}, family-wise {100 * alpha:g}%"


def corrected_p(correction: str) -> str:
    """Label a corrected p-value by the correction's name, such as "Holm p" for "holm"."""
    return f"{CORRECTIONS.get(correction, correction)} p"


def _figures(r: TestResult) -> str:
    level = f"{100 * r.level:.3g}%" if math.isfinite(r.level) else ""
    return (
        f"difference {r.estimate:+.2f} [{format_mc(r.low, r.interval_se)}, {format_mc(r.high, r.interval_se)}] at "
        f"{level}; "
        f"{family_clause(r.alpha, r.correction, r.family)}: corrected p={format_p(r.p_adjusted, r.p_adjusted_se)}"
    )


_WORDS = {  # each claim's words when established and when not
    "better": ("{s} ranks {w} better than {b}", "{s} is not shown to rank {w} better than {b}"),
    "worse": ("{s} ranks {w} worse than {b}", "{s} is not shown to rank {w} worse than {b}"),
    "equivalent": (
        "{s} ranks {w} as well as {b}, within ±{m:g} (two one-sided tests)",
        "{s} is not shown to rank {w} as well as {b} within ±{m:g} (two one-sided tests)",
    ),
}


def sentence(result: TestResult) -> str:
    """Say one tested claim in a sentence: what is established, not shown, or undecided, with its figures and family.

    Args:
        result: The tested claim.

    Returns:
        The sentence.

    Raises:
        ValueError: If the claim is none of the known ones.
    """
    r = result
    if r.claim not in _WORDS:
        raise ValueError(f"no words for the claim {r.claim!r}; known: {', '.join(_WORDS)}")
    fill = {"s": r.subject, "w": r.what, "b": r.baseline, "m": r.margin}
    established, not_shown = (t.format(**fill) for t in _WORDS[r.claim])
    where = f" {r.scope}" if r.scope else ""
    said = decision(r)
    if said == UNDECIDED:
        near = (
            f"a step of the {CORRECTIONS.get(r.correction, r.correction)} correction it rests on is within "
            f"{r.undecided_se:g} Monte Carlo standard errors of its threshold"
            if r.earlier_undecided and r.p_adjusted < r.alpha
            else f"its corrected p is within {r.undecided_se:g} Monte Carlo standard errors of {r.alpha:g}"
        )
        return f"Undecided{where} whether {established[0].lower()}{established[1:]}: {near} ({_figures(r)})."
    head = established if said == ESTABLISHED else not_shown
    return f"{head}{where} ({_figures(r)})."


def summary(results: list[TestResult]) -> list[str]:
    """Say a family's claims: each established or undecided one in full, the rest grouped with their p-values' range."""
    out = [sentence(r) for r in results if decision(r) != NOT_ESTABLISHED]
    groups: dict[tuple, list[TestResult]] = {}
    for r in results:
        if decision(r) == NOT_ESTABLISHED:
            groups.setdefault((r.claim, r.what, r.baseline, r.margin, r.scope), []).append(r)
    for (claim, what, baseline, margin, scope), rs in groups.items():
        subjects = ", ".join(r.subject for r in rs)
        head = _WORDS[claim][1].format(s=subjects, w=what, b=baseline, m=margin)
        if len(rs) > 1:
            head = head.replace(" is not shown", " are not shown", 1)
        p = [r.p_adjusted for r in rs]
        low, high = min(p), max(p)
        span = format_p(low, rs[p.index(low)].p_adjusted_se)
        if len(rs) > 1:
            top = format_p(high, rs[p.index(high)].p_adjusted_se)
            span = f"{span} for each" if top == span else f"from {span} to {top}"
        first = rs[0]
        out.append(
            f"{head}{' ' + scope if scope else ''} ({family_clause(first.alpha, first.correction, first.family)}; "
            f"corrected p {span})."
        )
    return out
