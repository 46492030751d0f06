"""Verdict words in one place (analysis/verdicts.py): the decision with its Monte Carlo error, the sentence's words
from the numbers, figures to the digit their error allows."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from vitplast_tune.analysis import verdicts


def result(**changes) -> verdicts.TestResult:
    base = dict(
        claim="better", subject="grad_norm", baseline="log(#params)", what="the subsets", estimate=0.12, low=0.02,
        high=0.2, level=0.994, p=0.001, p_se=0.0002, p_adjusted=0.017, p_adjusted_se=0.003, alpha=0.05,
        correction="holm", family=17, margin=0.1, scope="across these 4 tasks",
    )  # fmt: skip
    return verdicts.TestResult(**(base | changes))


def test_a_corrected_p_within_three_mc_errors_of_alpha_is_undecided():
    assert verdicts.decision(result()) == "established"
    assert verdicts.decision(result(p_adjusted=0.045, p_adjusted_se=0.002)) == "undecided"  # 2.5 errors below
    assert verdicts.decision(result(p_adjusted=0.056, p_adjusted_se=0.002)) == "undecided"  # 3 errors above
    assert verdicts.decision(result(p_adjusted=0.043, p_adjusted_se=0.002)) == "established"  # 3.5 errors: decided
    assert verdicts.decision(result(p_adjusted=0.0499, p_adjusted_se=0.0, undecided_se=3)) == "established"  # exact
    assert verdicts.decision(result(p_adjusted=0.3)) == "not established"
    assert verdicts.decision(result(p_adjusted=math.nan)) == "not established"
    said = verdicts.sentence(result(p_adjusted=0.045, p_adjusted_se=0.002))
    assert said.startswith("Undecided across these 4 tasks whether grad_norm ranks the subsets better")


def test_the_words_never_state_a_failure_to_reject_as_a_finding():
    said = verdicts.sentence(result(p_adjusted=0.4))
    assert said.startswith("grad_norm is not shown to rank the subsets better than log(#params) across these 4 tasks")
    same = verdicts.sentence(result(claim="equivalent", p_adjusted=0.001, p_adjusted_se=0.0003))
    assert "ranks the subsets as well as log(#params), within ±0.1 (two one-sided tests)" in same
    with pytest.raises(ValueError, match="no words for the claim"):
        verdicts.sentence(result(claim="no better"))


def test_alpha_and_the_correction_come_from_the_result():
    assert "Holm over 17 verdicts, family-wise 5%" in verdicts.sentence(result())
    other = verdicts.sentence(result(alpha=0.1, correction="bonferroni", family=3))
    assert "Bonferroni over 3 verdicts, family-wise 10%" in other and "Holm" not in other


def test_a_corrected_p_is_labelled_by_its_correction_and_no_report_types_one():
    assert verdicts.corrected_p("holm") == "Holm p" and verdicts.corrected_p("bonferroni") == "Bonferroni p"
    # The reports that word verdicts take the correction's name and the alpha from the numbers (verdicts), never typed.
    typed = re.compile(r"(Holm|Bonferroni) p=|family-wise \d")
    package = Path(verdicts.__file__).parents[1]
    found = [
        f"{path.relative_to(package)}:{i}"
        for folder in ("analysis", "lab", "workflows")
        for path in sorted((package / folder).glob("*.py"))
        if path.name != "verdicts.py"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if typed.search(line) and 'f"' in line  # an f-string that writes it (a pattern reading old reports may name it)
    ]
    assert found == []


def test_figures_are_printed_to_the_digit_their_mc_error_allows():
    assert verdicts.format_p(0.0123, 0.0008) == "0.01 (MC SE 0.0008)"  # a unit of the last digit >= 5 errors
    assert verdicts.format_p(0.0123, 0.00008) == "0.012 (MC SE 8e-05)"
    assert verdicts.format_p(1.0, 0.0) == "1"
    assert verdicts.format_mc(-0.3456, 0.004) == "-0.3" and verdicts.format_mc(-0.3456, 0.0004) == "-0.35"
    values = np.random.default_rng(0).normal(size=20000)
    se = verdicts.quantile_se(values, 0.025)  # the 2.5% quantile of 20,000 normal draws: about 0.018
    assert 0.01 < se < 0.03
    assert verdicts.p_se(0.0, 2000) == pytest.approx(1 / 2000) and verdicts.p_se(0.5, 10000) == pytest.approx(0.005)


def test_the_summary_groups_what_is_not_established():
    rs = [
        result(subject="a", p_adjusted=1.0, p_adjusted_se=0.0),
        result(subject="b", p_adjusted=1.0, p_adjusted_se=0.0),
    ]
    rs.append(result(subject="c"))
    lines = verdicts.summary(rs)
    assert lines[0].startswith("c ranks the subsets better") and len(lines) == 2
    assert lines[1].startswith("a, b are not shown to rank the subsets better") and "corrected p 1 for each" in lines[1]


def test_a_claim_resting_on_an_undecided_earlier_step_says_so():
    assert verdicts.decision(result(earlier_undecided=True)) == "undecided"  # its own corrected p 0.017 is decided
    assert verdicts.decision(result(p_adjusted=0.3, earlier_undecided=True)) == "not established"
    said = verdicts.sentence(result(earlier_undecided=True))
    assert "a step of the Holm correction it rests on is within 3 Monte Carlo standard errors" in said
