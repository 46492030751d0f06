"""Verdict words, written in one place: a test result (its statistic, interval, corrected p and its Monte Carlo error,
the family's alpha and correction) becomes the sentence every report prints.

Nothing here is typed into a sentence that the numbers do not carry: the alpha, the correction's name and the family's
size come from the result, and a corrected p within ``undecided_se`` Monte Carlo standard errors of alpha is
"undecided", never a finding. A claim not established is said as such ("not shown to rank ... better"), never as its
opposite. Figures drawn from resamples are printed to the digit their Monte Carlo error allows (``format_mc``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CORRECTIONS = {"holm": "Holm", "bonferroni": "Bonferroni"}  # statsmodels' multipletests names -> as printed
ESTABLISHED, NOT_ESTABLISHED, UNDECIDED = "established", "not established", "undecided"


@dataclass(frozen=True)
class TestResult:
    """One tested claim, with its estimate, interval, p-values and family.

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
        p_se: Its Monte Carlo standard error (0: exact).
        p_adjusted: The p-value corrected for the family.
        p_adjusted_se: Its Monte Carlo standard error (0: exact).
        alpha: The family's level.
        correction: The family's correction for multiple tests.
        family: How many hypotheses the family holds.
        margin: The margin of an equivalence claim.
        interval_se: The Monte Carlo error of the interval's ends.
        scope: Where the claim holds (e.g. "across these 4 tasks").
        undecided_se: How many Monte Carlo standard errors from ``alpha`` a corrected p leaves the claim undecided.
        earlier_undecided: Whether a step of a step-down correction (Holm) that this claim's rejection rests on, an
            earlier hypothesis's p against its own threshold, is within ``undecided_se`` of its Monte Carlo errors.
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
    interval_se: float = math.nan  # the Monte Carlo error of the interval's ends
    scope: str = ""
    undecided_se: float = 3.0
    earlier_undecided: bool = False


def decision(result: TestResult) -> str:
    """ "established" (corrected p below alpha, more than ``undecided_se`` Monte Carlo errors from it, and no earlier
    step it rests on undecided), "undecided" (within them, or resting on such a step), else "not established"; "not
    established" for an untested (NaN) p."""
    p, se = result.p_adjusted, result.p_adjusted_se
    if not math.isfinite(p):
        return NOT_ESTABLISHED
    if p < result.alpha and result.earlier_undecided:
        return UNDECIDED
    if abs(p - result.alpha) <= result.undecided_se * (se if math.isfinite(se) else 0.0):
        return UNDECIDED
    return ESTABLISHED if p < result.alpha else NOT_ESTABLISHED


def quantile_se(samples, q: float) -> float:
    """The Monte Carlo standard error of the ``q`` quantile of bootstrap values, from the order statistics
    ``sqrt(B q (1 - q))`` ranks either side of it (half their distance); NaN without values."""
    values = np.sort(np.asarray(samples if samples is not None else [], dtype=float))
    values = values[np.isfinite(values)]
    if len(values) < 2:
        return math.nan
    k, d = q * (len(values) - 1), math.sqrt(len(values) * q * (1 - q))
    low, high = int(max(0, math.floor(k - d))), int(min(len(values) - 1, math.ceil(k + d)))
    return float(values[high] - values[low]) / 2


def p_se(p: float, n: int) -> float:
    """The Monte Carlo standard error of a share ``p`` of ``n`` resamples (of one resample's share at 0 or 1)."""
    if not math.isfinite(p) or n <= 0:
        return math.nan
    return math.sqrt(p * (1 - p) / n) if 0 < p < 1 else 1 / n


def mc_decimals(se: float, most: int = 4) -> int:
    """The decimals a figure with Monte Carlo standard error ``se`` is printed to: its last digit worth at least 5
    standard errors, so a rerun with another bootstrap seed moves it by at most one unit; ``most`` when exact."""
    if not math.isfinite(se) or se <= 0:
        return most
    return max(0, min(most, math.floor(-math.log10(5 * se))))


def format_mc(value: float, se: float, *, most: int = 2, signed: bool = True) -> str:
    """``value`` to the decimals its Monte Carlo error allows (at most ``most``), e.g. "+0.2"; "nan" when not finite."""
    if not math.isfinite(value):
        return "nan"
    return f"{value:{'+' if signed else ''}.{mc_decimals(se, most)}f}"


def format_p(p: float, se: float) -> str:
    """A p-value with its Monte Carlo standard error, "0.01 (MC SE 0.0008)"; one without error (exact, or capped at
    1) to 3 digits."""
    if not math.isfinite(p):
        return "nan"
    if not math.isfinite(se) or se == 0:
        return f"{p:.3g}"
    return f"{format_mc(p, se, most=4, signed=False)} (MC SE {se:.1g})"


def family_clause(alpha: float, correction: str, family: int) -> str:
    """The family a verdict was judged in, from its numbers: "Holm over 17 verdicts, family-wise 5%"."""
    name = CORRECTIONS.get(correction, correction)
    return f"{name} over {family} verdict{'s' if family != 1 else ''}, family-wise {100 * alpha:g}%"


def corrected_p(correction: str) -> str:
    """Label a p-value adjusted by a correction as a sentence prints it, from the correction's name.

    Args:
        correction: statsmodels' name of the correction (``CORRECTIONS``), e.g. ``multiple.CORRECTION``.

    Returns:
        The label, e.g. "Holm p" for "holm".
    """
    return f"{CORRECTIONS.get(correction, correction)} p"


def _figures(r: TestResult) -> str:
    level = f"{100 * r.level:.3g}%" if math.isfinite(r.level) else ""
    return (
        f"difference {r.estimate:+.2f} [{format_mc(r.low, r.interval_se)}, {format_mc(r.high, r.interval_se)}] at "
        f"{level}; "
        f"{family_clause(r.alpha, r.correction, r.family)}: corrected p={format_p(r.p_adjusted, r.p_adjusted_se)}"
    )


_WORDS = {  # claim -> (established, not established)
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
        ValueError: The claim is none of the known ones.
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
    """A family's sentences: each established or undecided claim in full (``sentence``), the claims not established
    grouped by what they claim, with the range of their corrected p-values."""
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
