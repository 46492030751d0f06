"""Family-wise error control (analysis/multiple.py): Holm's adjusted p-values against statsmodels' own, and intervals
that agree with their verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from vitplast_tune.analysis import multiple


@pytest.mark.parametrize("seed", range(5))
def test_holm_adjusted_p_values_are_statsmodels(seed):
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(seed)
    p = np.concatenate([rng.uniform(0, 0.02, 3), rng.uniform(0, 1, 6), [0.0, 1.0, 0.5, 0.5]])
    np.testing.assert_allclose(multiple.holm(p), multipletests(p, method="holm")[1])
    with_untested = np.concatenate([p, [np.nan, np.nan]])
    adjusted = multiple.holm(with_untested)
    assert np.isnan(adjusted[-2:]).all()  # untested: not counted in the family
    np.testing.assert_allclose(adjusted[:-2], multipletests(p, method="holm")[1])
    rejected = multipletests(p, alpha=0.05, method="holm")[0]
    assert ((adjusted[:-2] < 0.05) == rejected).all()


def test_a_percentile_interval_excludes_zero_exactly_when_its_p_value_is_below_its_level():
    rng = np.random.default_rng(0)
    for _ in range(300):
        samples = rng.normal(rng.normal(0, 0.3), 0.1, size=int(rng.integers(20, 400))).round(2)
        level = rng.uniform(0.8, 0.999)
        low, high = multiple.percentile_interval(samples, level)
        assert (low > 0 or high < 0) == (multiple.bootstrap_p(samples) < 1 - level)


def test_judge_prints_each_verdict_with_an_interval_that_agrees_with_it():
    """Four hypotheses: two far from 0, one near, one at 0; Holm rejects the first two, each printed at its Holm step,
    and the others at Bonferroni's level, where their intervals include 0."""
    rng = np.random.default_rng(1)
    samples = [rng.normal(m, 0.1, 4000) for m in (0.6, -0.5, 0.22, 0.0)]
    judged = multiple.judge([0.6, -0.5, 0.22, 0.0], samples)
    assert judged["verdict"].tolist() == ["above 0", "below 0", "not different from 0", "not different from 0"]
    assert judged.attrs["family"] == 4
    assert judged["level"].tolist() == pytest.approx([1 - 0.05 / 4, 1 - 0.05 / 3, 1 - 0.05 / 4, 1 - 0.05 / 4])
    assert judged.loc[0, "low"] > 0 and judged.loc[1, "high"] < 0
    assert judged.loc[2, "low"] < 0 < judged.loc[2, "high"] and judged.loc[2, "p"] < 0.05  # significant alone only
    given = multiple.judge([0.6, 0.3], [samples[0], None], [None, 0.001])  # an exact p-value joins the family
    assert given["verdict"].tolist() == ["above 0", "above 0"] and np.isnan(given.loc[1, "low"])
    untested = multiple.judge([0.6, 0.1], [samples[0], None])
    assert untested.attrs["family"] == 1 and untested.loc[1, "verdict"] == ""


def test_holm_comes_from_statsmodels(monkeypatch):
    """The adjustment is statsmodels' own: a stand-in for ``multipletests`` is what ``holm`` and the levels read."""
    calls = []

    def stand_in(p, alpha=0.05, method="holm"):
        calls.append((method, len(p)))
        return np.zeros(len(p), dtype=bool), np.full(len(p), 0.5), None, None

    monkeypatch.setattr(multiple, "multipletests", stand_in)
    assert multiple.holm([0.01, np.nan, 0.2]).tolist()[::2] == [0.5, 0.5] and calls == [("holm", 2)]
    assert multiple.interval_levels([0.001, 0.04]).tolist() == pytest.approx([1 - 0.05 / 2] * 2)  # none rejected


def test_interval_levels_step_with_the_rank_and_ties_keep_their_order():
    """Three rejected at their Holm steps (the smallest p at 1 - alpha/m), a tie at the same p stepping in order, and
    the last, not rejected, at Bonferroni's level."""
    levels = multiple.interval_levels([0.002, 0.0001, 0.002, 0.9, np.nan])
    assert levels[:4].tolist() == pytest.approx([1 - 0.05 / 3, 1 - 0.05 / 4, 1 - 0.05 / 2, 1 - 0.05 / 4])
    assert np.isnan(levels[4])
