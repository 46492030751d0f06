"""The hierarchical bootstrap (analysis/resampling.py) against what it must equal: the two-level bootstrap's variance
of a mean, known in closed form, and a naive two-level resampling written here with loops."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from vitplast_tune.analysis.correlation import spearman
from vitplast_tune.analysis.resampling import Runs, best_target, point_targets, resample, runs_of


def runs_from(targets: list[np.ndarray], selects: list[np.ndarray] | None = None) -> Runs:
    """Runs of configurations given their (rates, seeds) target arrays (selection = target unless given)."""
    selects = selects or targets
    return Runs([(i,) for i in range(len(targets))], [np.arange(t.shape[0]) for t in targets], selects, targets)


def test_the_bootstrap_variance_of_a_mean_is_the_two_level_formula():
    """One rate per configuration: the mean over configurations of their seed means. Resampling configurations, then
    seeds within each, its bootstrap variance is (1/C) [between + mean within / S] with the plug-in (ddof=0) variances:
    between = var of the configuration means, within = each configuration's variance over its seeds."""
    rng = np.random.default_rng(0)
    configs, seeds = 12, 3
    targets = [rng.normal(rng.normal(0, 0.3), 1.0, size=(1, seeds)) for _ in range(configs)]  # seeds' noise large
    means = np.array([t.mean() for t in targets])
    within = np.array([t.var() for t in targets])
    expected = (means.var() + within.mean() / seeds) / configs
    _, resampled = resample(runs_from(targets), 40_000, seed=1)
    assert resampled.mean(axis=1).var() == pytest.approx(expected, rel=0.03)
    assert within.mean() / seeds > 0.15 * means.var()  # so leaving the seeds out would miss a sixth of it or more
    assert point_targets(runs_from(targets)) == pytest.approx(means)


def naive_resample(runs: Runs, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two-level resampling by hand: draw configurations, then for each drawn one its seeds, pick the rate with the best
    mean selection metric over them, and take its mean target there."""
    draw = random.Random(seed)
    n = len(runs)
    drawn, targets = np.empty((n_boot, n), int), np.empty((n_boot, n))
    for b in range(n_boot):
        for j in range(n):
            c = draw.randrange(n)
            columns = [draw.randrange(runs.select[c].shape[1]) for _ in range(runs.select[c].shape[1])]
            sel = [np.mean(runs.select[c][r, columns]) for r in range(runs.select[c].shape[0])]
            drawn[b, j], targets[b, j] = c, np.mean(runs.target[c][int(np.argmax(sel)), columns])
    return drawn, targets


def test_the_vectorized_resampling_matches_a_naive_two_level_loop():
    """Configurations at three rates whose best one varies with the seeds drawn: the Spearman of a predictor with the
    resampled accuracies has the same distribution (mean and 5%/95% quantiles within Monte Carlo error) both ways."""
    rng = np.random.default_rng(3)
    quality = rng.uniform(0.5, 0.9, 15)
    selects, targets = [], []
    for q in quality:
        sel = q + np.array([[-0.02], [0.0], [-0.01]]) + rng.normal(0, 0.02, (3, 3))  # close rates: the choice varies
        selects.append(sel)
        targets.append(sel + rng.normal(0, 0.01, (3, 3)))
    runs = runs_from(targets, selects)
    predictor = quality + rng.normal(0, 0.1, 15)
    fast = spearman(predictor[resample(runs, 4000, seed=0)[0]], resample(runs, 4000, seed=0)[1])
    slow = spearman(predictor[naive_resample(runs, 4000, 7)[0]], naive_resample(runs, 4000, 7)[1])
    assert np.nanmean(fast) == pytest.approx(np.nanmean(slow), abs=0.02)
    for q in (5, 95):
        assert np.nanpercentile(fast, q) == pytest.approx(np.nanpercentile(slow, q), abs=0.04)


def test_runs_of_a_trial_table_keep_missing_runs_as_nan_and_pick_as_best_lr_table_does():
    trials = pd.DataFrame(
        {
            "components": ["mha"] * 5 + ["fc1"] * 2,
            "lr": [0.1, 0.1, 0.3, 0.3, 1.0, 0.1, 0.3],
            "seed": [0, 1, 0, 1, 0, 0, 0],
            "best_val_acc": [0.8, 0.9, 0.85, 0.95, np.nan, 0.5, 0.6],
            "test_acc": [0.7, 0.8, 0.75, 0.85, np.nan, 0.4, np.nan],
        }
    )
    runs = runs_of(trials, [("mha",), ("fc1",)])
    assert runs.lrs[0].tolist() == [0.1, 0.3, 1.0] and runs.select[0].shape == (3, 2)
    assert np.isnan(runs.select[0][2]).all()  # a rate whose only run diverged: counts as the worst
    assert point_targets(runs)[0] == pytest.approx(0.80)  # lr 0.3: mean val 0.90
    assert point_targets(runs)[1] == pytest.approx(0.40)  # fc1 at 0.3 has no test accuracy: not a candidate
    assert best_target(np.array([[np.nan, np.nan], [0.1, 0.2]]), np.array([[9.0, 9.0], [1.0, 2.0]])) == 1.5
