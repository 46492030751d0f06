"""Rank statistics (analysis/correlation.py): Spearman and Kendall with BCa intervals, the paired difference of two
predictors, partial correlations, exact permutation p-values below ten points."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from vitplast_tune.analysis.bootstrap import bca, bca_from_resamples
from vitplast_tune.analysis.correlation import (
    MIN_POINTS,
    compare_predictors,
    compare_with_baseline,
    correlations,
    interval,
    kendall,
    partial_correlations,
    partial_spearman,
    permutation_p,
    point_stats,
    spearman,
)
from vitplast_tune.errors import UserError


def test_monotone_data_gives_spearman_one_with_a_tight_interval():
    x = np.arange(20.0)
    trials = pd.DataFrame({"score": x, "neg": -x, "val_acc": x**3 + 1})
    table = correlations(trials, ["score", "neg"], n_boot=200).set_index("predictor")
    assert table.loc["score", ["spearman", "spearman_low", "spearman_high", "kendall"]].tolist() == pytest.approx(
        [1, 1, 1, 1]
    )
    assert table.loc["neg", ["spearman", "spearman_low", "spearman_high"]].tolist() == pytest.approx([-1, -1, -1])
    assert table.loc["score", "n"] == 20 and table.loc["score", "note"] == ""
    assert 0 < table.loc["score", "n_boot"] <= 200


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    rng = np.random.default_rng(1)
    x = rng.normal(size=40)
    trials = pd.DataFrame({"score": x, "val_acc": x + rng.normal(size=40)})
    a = correlations(trials, ["score"], n_boot=300, seed=3)
    b = correlations(trials, ["score"], n_boot=300, seed=3)
    pd.testing.assert_frame_equal(a, b)
    row = a.iloc[0]
    assert row["spearman_low"] < row["spearman"] < row["spearman_high"]
    assert row["kendall_low"] < row["kendall"] < row["kendall_high"]


def test_too_few_trials_give_nan_and_a_note():
    trials = pd.DataFrame({"score": [1.0, 2.0, 3.0, 4.0], "val_acc": [0.1, 0.2, 0.3, 0.4]})
    row = correlations(trials, ["score"], min_trials=5).iloc[0]
    assert row["n"] == 4
    assert np.isnan(row[["spearman", "spearman_low", "spearman_high", "kendall", "kendall_p"]].astype(float)).all()
    assert row["note"] == "too few finished trials (n < 5)"


def test_n_counts_rows_where_predictor_and_target_are_finite():
    trials = pd.DataFrame(
        {
            "score": [1, 2, np.nan, 4, 5, 6, np.inf, 8],
            "val_acc": [0.1, None, 0.3, 0.4, 0.5, 0.6, 0.7, "failed"],
            "flat": [1.0] * 8,
        }
    )
    table = correlations(trials, ["score", "flat"], min_trials=3, n_boot=50).set_index("predictor")
    assert table.loc["score", "n"] == 4  # rows 0, 3, 4, 5
    assert table.loc["score", "spearman"] == pytest.approx(1.0)
    assert table.loc["flat", "n"] == 6 and np.isnan(table.loc["flat", "spearman"])
    assert table.loc["flat", "note"] == "predictor is constant"
    with pytest.raises(UserError, match='no column "scor"'):
        correlations(trials, ["scor"])


def test_bca_interval_agrees_with_the_fisher_z_interval_on_a_large_sample():
    """An expectation from outside the code: for n = 200 the bootstrap interval of Spearman's rho is close to the
    normal-theory one, tanh(atanh(r) +- 1.96 sqrt(1.06 / (n - 3))) (Fieller, Hartley and Pearson, 1957)."""
    import math

    rng = np.random.default_rng(1)
    x = rng.normal(size=200)
    trials = pd.DataFrame({"score": x, "val_acc": x + 0.8 * rng.normal(size=200)})
    row = correlations(trials, ["score"], n_boot=2000, seed=7).iloc[0]
    z, se = math.atanh(row["spearman"]), math.sqrt(1.06 / (200 - 3))
    assert row["spearman_low"] == pytest.approx(math.tanh(z - 1.96 * se), abs=0.015)
    assert row["spearman_high"] == pytest.approx(math.tanh(z + 1.96 * se), abs=0.015)
    assert row["spearman_low"] < row["spearman"] < row["spearman_high"]


def test_paired_difference_decides_which_predictor_is_better():
    rng = np.random.default_rng(0)
    y = rng.normal(size=60)
    trials = pd.DataFrame({"good": y + 0.1 * rng.normal(size=60), "noise": rng.normal(size=60), "y": y})
    better = compare_predictors(trials, "good", "noise", "y", n_boot=500)
    assert better["verdict"] == "better" and better["diff_low"] > 0 and better["n"] == 60
    assert compare_predictors(trials, "noise", "good", "y", n_boot=500)["verdict"] == "worse"
    same = trials.assign(copy=trials["noise"] + 1e-9 * rng.normal(size=60))
    assert compare_predictors(same, "copy", "noise", "y", n_boot=500)["verdict"] == "no clear difference"


def test_partial_correlation_removes_a_learning_rate_confound():
    rng = np.random.default_rng(2)
    lr = 10 ** rng.uniform(-3, 0, size=80)
    score = np.log(lr) + 0.1 * rng.normal(size=80)  # tracks lr, says nothing else about accuracy
    acc = np.log(lr) + 0.3 * rng.normal(size=80)
    trials = pd.DataFrame({"score": score, "lr": lr, "val_acc": acc})
    assert correlations(trials, ["score"], n_boot=100).iloc[0]["spearman"] > 0.8
    row = partial_correlations(trials, ["score"], "val_acc", "lr", n_boot=300).iloc[0]
    assert abs(row["partial_spearman"]) < 0.3 and row["partial_low"] < 0 < row["partial_high"]


def test_each_criterion_its_baseline_and_their_difference_use_the_same_rows():
    """A hand-made table where the rows differ: p is unknown for the head (like a plasticity score), the baseline
    for one other row; every figure of p's row comes from the 12 rows where p, the baseline and y are known."""
    from scipy import stats

    rng = np.random.default_rng(5)
    y = rng.normal(size=14)
    frame = pd.DataFrame(
        {
            "p": y + 0.5 * rng.normal(size=14),
            "log_trainable_params": y + 2.0 * rng.normal(size=14),
            "y": y,
        }
    )
    frame.loc[0, "p"] = np.nan  # the head: no score
    frame.loc[1, "log_trainable_params"] = np.nan
    table = compare_with_baseline(frame, ["p", "log_trainable_params"], "log_trainable_params", "y", n_boot=300)
    row, base = table.set_index("predictor").loc["p"], table.set_index("predictor").loc["log_trainable_params"]
    common = frame.iloc[2:]  # both known
    assert row["n"] == 12 and base["n"] == 13
    assert row["spearman"] == pytest.approx(stats.spearmanr(common["p"], common["y"]).statistic)
    assert row["kendall"] == pytest.approx(stats.kendalltau(common["p"], common["y"]).statistic)
    expected_base = stats.spearmanr(common["log_trainable_params"], common["y"]).statistic
    assert row["baseline_spearman"] == pytest.approx(expected_base)
    assert row["diff_vs_baseline"] == pytest.approx(row["spearman"] - expected_base)
    own = frame.iloc[[0, *range(2, 14)]]  # the baseline's own row: where it is known
    assert base["spearman"] == pytest.approx(stats.spearmanr(own["log_trainable_params"], own["y"]).statistic)
    assert np.isfinite(row["diff_p"]) and 0 < row["diff_p"] <= 1


def test_an_interval_that_cannot_be_formed_is_undetermined_not_no_clear_difference():
    """A predictor that differs in one row of 12 is constant in (11/12)^12 = 35% of the resamples, far more than
    MAX_DEGENERATE: its rank correlation has no interval, and the comparison says so."""
    y = np.arange(12.0)
    frame = pd.DataFrame({"one": [1.0] * 11 + [0.0], "base": y[::-1] + 0.5 * np.sin(y), "y": y})
    c = compare_predictors(frame, "one", "base", "y", n_boot=400, min_points=5)
    assert np.isnan(c["diff_low"]) and np.isnan(c["diff_high"]) and np.isfinite(c["diff"])
    assert c["verdict"] == "undetermined"
    table = compare_with_baseline(frame, ["one", "base"], "base", "y", n_boot=400, min_points=5).set_index("predictor")
    assert table.loc["one", "verdict"] == "undetermined" and np.isnan(table.loc["one", "diff_p"])
    assert interval(table.loc["one", "diff_low"], table.loc["one", "diff_high"]) == "[undetermined]"


def test_below_the_minimum_the_figures_are_shown_without_a_verdict():
    rng = np.random.default_rng(3)
    n = MIN_POINTS - 2
    y = np.arange(float(n))
    frame = pd.DataFrame({"good": y, "log_trainable_params": rng.permutation(y), "y": y})
    c = compare_predictors(frame, "good", "log_trainable_params", "y", n_boot=300)
    assert c["verdict"] == f"no verdict (n < {MIN_POINTS})" and np.isfinite(c["diff"])
    table = compare_with_baseline(frame, ["good", "log_trainable_params"], "log_trainable_params", "y", n_boot=300)
    good = table.set_index("predictor").loc["good"]
    assert good["spearman"] == pytest.approx(1.0) and good["verdict"] == f"no verdict (n < {MIN_POINTS})"
    big = pd.DataFrame(
        {"good": np.arange(40.0), "log_trainable_params": rng.permutation(np.arange(40.0)), "y": np.arange(40.0)}
    )
    assert compare_predictors(big, "good", "log_trainable_params", "y", n_boot=300)["verdict"] == "better"


def test_a_partial_correlation_is_undefined_on_degenerate_rows_and_its_interval_says_so():
    z = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    three = np.array([1.0, 1, 2, 2, 3])
    assert np.isnan(partial_spearman(three, np.array([2.0, 2, 1, 1, 3]), three + 4))  # 3 distinct rows
    assert np.isnan(partial_spearman(2 * z, np.array([3.0, 1, 2, 5, 4]), z))  # x is a function of z
    assert np.isfinite(partial_spearman(np.array([2.0, 1, 4, 3, 5]), np.array([3.0, 1, 2, 5, 4]), z))
    # 8 trials whose score takes 2 values: many resamples leave it a function of lr, or 3 distinct rows
    rng = np.random.default_rng(1)
    lr = 10 ** rng.uniform(-3, 0, 8)
    trials = pd.DataFrame({"score": [2.0, 1.0] * 4, "lr": lr, "acc": np.log10(lr) + rng.normal(0, 0.1, 8)})
    row = partial_correlations(trials, ["score"], "acc", "lr", n_boot=500).iloc[0]
    assert (row["partial_low"], row["partial_high"]) != (0.0, 1.0)
    assert np.isnan(row["partial_low"]) and interval(row["partial_low"], row["partial_high"]) == "[undetermined]"


def test_bca_on_the_defined_resamples_is_scipys_bca_when_all_are_defined():
    from scipy import stats

    rng = np.random.default_rng(11)
    x = rng.normal(size=25)
    y = x + rng.normal(size=25)
    res = stats.bootstrap(
        (x, y), spearman, paired=True, vectorized=True, n_resamples=800, method="BCa", rng=np.random.default_rng(2)
    )
    low, high = bca_from_resamples((x, y), spearman, np.asarray(res.bootstrap_distribution))
    assert low == pytest.approx(res.confidence_interval.low, rel=1e-9)
    assert high == pytest.approx(res.confidence_interval.high, rel=1e-9)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)


@pytest.mark.parametrize("n", [2, 9, 40, 130])  # the pairwise signs up to 100 points, scipy's per row beyond
def test_kendall_along_an_axis_is_scipys_tau_b_of_each_row(n):
    from scipy import stats

    rng = np.random.default_rng(n)
    x = rng.integers(0, 4, (7, n)).astype(float)  # many ties
    y = rng.normal(size=(7, n)).round(1)
    x[0] = 1.0  # a constant row: no tau
    expected = [np.nan] + [stats.kendalltau(a, b).statistic for a, b in zip(x[1:], y[1:])]
    assert kendall(x, y) == pytest.approx(expected, abs=1e-12, nan_ok=True)
    assert kendall(x.T, y.T, axis=0) == pytest.approx(expected, abs=1e-12, nan_ok=True)
    assert kendall(x[1], y[1]) == pytest.approx(expected[1], abs=1e-12)  # one row: a float


def test_small_samples_get_exact_permutation_p_values_not_the_t_approximation():
    """Five components ranked 5 > 4 > 2 > 3 > 1 against 5 > 4 > 3 > 2 > 1: Spearman +0.90, whose exact two-sided p is
    10 of the 120 orderings (0.083); scipy's t-approximation says 0.037. Checked by enumerating the orderings here."""
    import itertools

    from scipy import stats

    x, y = np.array([5.0, 4, 3, 2, 1]), np.array([5.0, 4, 2, 3, 1])
    rhos = [stats.spearmanr(x, np.array(order)).statistic for order in itertools.permutations(y)]
    by_hand = np.mean(np.abs(rhos) >= 0.9 - 1e-12)
    assert by_hand == pytest.approx(10 / 120)
    assert permutation_p(x, y) == pytest.approx(by_hand)
    assert stats.spearmanr(x, y).pvalue == pytest.approx(0.0374, abs=1e-3)  # what was printed before
    small = point_stats(x, y)
    assert small["spearman_p"] == pytest.approx(10 / 120) and small["kendall_p"] == pytest.approx(10 / 120)
    taus = [stats.kendalltau(x, np.array(order)).statistic for order in itertools.permutations(y)]
    assert permutation_p(x, y, kendall) == pytest.approx(np.mean(np.abs(taus) >= 0.8 - 1e-12))
    big = np.arange(12.0)
    assert point_stats(big, big[::-1])["spearman_p"] == pytest.approx(stats.spearmanr(big, big[::-1]).pvalue)


def test_permutation_p_keeps_ties_and_counts_every_pairing():
    x, y = np.array([1.0, 1, 2, 3, 4, 5]), np.array([2.0, 1, 1, 4, 3, 6])
    import itertools

    rho = spearman(x, y)
    values = [spearman(x, np.array(p)) for p in itertools.permutations(y)]
    assert permutation_p(x, y) == pytest.approx(np.mean(np.abs(values) >= abs(rho) - 1e-12))
    assert math.isnan(permutation_p(np.ones(4), np.arange(4.0)))


def test_the_bca_p_value_is_where_the_bca_interval_reaches_zero():
    rng = np.random.default_rng(0)
    y = rng.normal(size=40)
    data = (y + rng.normal(size=40), rng.normal(size=40), y)

    def diff(a, b, t, axis=-1):
        return spearman(a, t, axis) - spearman(b, t, axis)

    p = bca(data, diff, n_boot=2000, vectorized=True, null=0.0).p
    assert 0.01 < p < 0.9
    inside = bca(data, diff, n_boot=2000, level=1 - p - 0.005, vectorized=True)
    outside = bca(data, diff, n_boot=2000, level=1 - p + 0.005, vectorized=True)
    assert inside[0] > 0 and outside[0] < 0  # the interval's lower end crosses 0 at level 1 - p
