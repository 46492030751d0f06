"""The per-trial analysis (analysis/prediction.py): every plasticity score against the parameter count, its verdict
adjusted for all those the analysis prints."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from vitplast_tune.analysis.correlation import MIN_POINTS, compare_predictors
from vitplast_tune.analysis.prediction import analyze_trials, describe_correlations


def test_the_per_trial_verdict_waits_for_enough_trials(tmp_path):
    rng = np.random.default_rng(8)
    n = MIN_POINTS - 2
    acc = np.linspace(0.5, 0.9, n)
    trials = pd.DataFrame(
        {
            "components": ["mha"] * n,
            "lr": 0.1,
            "plasticity_mean": acc + 0.01 * rng.normal(size=n),
            "trainable_params": rng.integers(1000, 100000, size=n),
            "val_acc": acc,
            "step": 10,
            "max_steps": 10,
        }
    )
    text = describe_correlations(analyze_trials(trials, tmp_path, n_boot=200).correlations)
    assert "too few trials to judge" in text and "ranks these trials better" not in text


def test_all_three_plasticity_scores_are_judged_under_one_holm_family(tmp_path):
    """Each of the three scores against the parameter count in each view, none picked by its point estimate: Holm's
    p over all of them (as statsmodels computes it), and a verdict only where the adjusted interval excludes 0."""
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(8)
    n = 40
    acc = rng.uniform(0.5, 0.9, n)
    trials = pd.DataFrame(
        {
            "components": ["mha"] * n,
            "lr": 0.1,
            "plasticity_mean": acc + 0.01 * rng.normal(size=n),  # ranks the trials as their accuracy
            "plasticity_max": rng.normal(size=n),
            "plasticity_weighted": acc + 0.08 * rng.normal(size=n),  # a little better than the parameter count
            "trainable_params": np.exp(acc * 5 + rng.normal(0, 1.0, n)),
            "val_acc": acc,
            "val_acc_common": acc + 0.02 * rng.normal(size=n),
            "step": 10,
            "max_steps": 10,
        }
    )
    table = analyze_trials(trials, tmp_path, n_boot=500).correlations
    tested = table[table["p_holm"].notna()]
    assert set(tested["predictor"]) == {"plasticity_mean", "plasticity_max", "plasticity_weighted"}
    assert set(tested["target"]) == {"val_acc", "val_acc_common"} and len(tested) == 6
    np.testing.assert_allclose(tested["p_holm"], multipletests(tested["diff_p"], method="holm")[1])
    for r in tested.itertuples():
        assert (r.verdict == "better") == (r.p_holm < 0.05 and r.diff_low > 0)
        assert (r.verdict == "worse") == (r.p_holm < 0.05 and r.diff_high < 0)
    rows = tested.set_index(["predictor", "target"])
    assert rows.loc[("plasticity_mean", "val_acc"), "verdict"] == "better"
    marginal = rows.loc[("plasticity_weighted", "val_acc_common")]  # below 5% alone, not after Holm
    assert marginal["diff_p"] < 0.05 <= marginal["p_holm"] and marginal["verdict"] == "no clear difference"
    assert marginal["level"] == pytest.approx(1 - 0.05 / 6) and marginal["diff_low"] < 0 < marginal["diff_high"]
    alone = compare_predictors(
        trials.assign(log_trainable_params=np.log(trials["trainable_params"])),
        "plasticity_weighted",
        "log_trainable_params",
        "val_acc_common",
        n_boot=500,
    )
    assert alone["diff_low"] > 0  # its unadjusted 95% interval excludes 0: printing that one would claim it
    text = describe_correlations(table)
    assert (
        "adjusted for the verdicts below: Holm over 6 verdicts, family-wise 5%" in text
        and text.count("-> plasticity_") == 6
    )  # three scores, two views
