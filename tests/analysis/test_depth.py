"""The depth analysis (analysis/depth.py): each subset at each depth at its best rate, whether its most plastic depth
is its best among depths none of which contains another, against a computed chance."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from tests.analysis._tables import depth_trials
from vitplast_tune.analysis.depth import (
    agreement_test,
    analyze_depth,
    comparable_depths,
    depth_agreement,
    describe_depth,
    varies_depth,
)


def test_only_depths_that_contain_no_other_are_compared():
    assert comparable_depths(["first", "middle", "last", "all"], 4) == ["first", "middle", "last"]
    assert comparable_depths(["0-1", "1-2", "2-3", "all"], 4) == ["0-1", "1-2", "2-3"]  # overlapping, none inside
    assert comparable_depths(["0", "0-1"], 4) == ["0"]


def test_the_chance_of_agreement_is_computed_and_the_count_tested_exactly():
    """Three subsets at 3, 3 and 2 comparable depths: chances 1/3, 1/3, 1/2; the law of the count by enumerating every
    outcome here, against the Poisson-binomial convolution."""
    agreement = pd.DataFrame({"agree": [True, True, False], "chance": [1 / 3, 1 / 3, 1 / 2]})
    test = agreement_test(agreement)
    assert test["expected"] == pytest.approx(7 / 6) and test["agree"] == 2
    by_hand = sum(
        np.prod([q if hit else 1 - q for hit, q in zip(outcome, agreement["chance"])])
        for outcome in itertools.product((0, 1), repeat=3)
        if sum(outcome) >= 2
    )
    assert test["p"] == pytest.approx(by_hand)


def test_depth_analysis_uses_in_network_plasticity_and_leaves_all_out_of_the_depth_question(tmp_path):
    trials = depth_trials().copy()
    whole = depth_trials()[lambda t: t["depth"] == "first"].assign(depth="all", best_val_acc=0.99, test_acc=0.99)
    trials = pd.concat([trials, whole], ignore_index=True)  # every subset best in all blocks, as on the testbed
    assert varies_depth(trials) and not varies_depth(trials.assign(depth="all"))
    configs = list(dict.fromkeys(zip(trials["components"], trials["depth"])))
    in_network = {"first": 3.0, "middle": 2.0, "last": 1.0, "all": 2.0}  # the reverse of the paper scores
    predictors = pd.DataFrame(
        {"in_network_mean": [in_network[d] for _, d in configs]}, index=pd.MultiIndex.from_tuples(configs)
    )
    layers = pd.DataFrame({0: [1.0, 2.0], 1: [1.5, 2.5]}, index=pd.Index(["mha", "fc1"], name="component"))
    found = analyze_depth(trials, tmp_path, num_blocks=4, layers=layers, predictors=predictors, n_boot=300)
    assert found.score == "in_network_mean"
    table = found.table.set_index(["components", "depth"])
    assert table.loc[("mha", "last"), "lr"] == 0.3 and table.loc[("mha", "last"), "mean"] == pytest.approx(0.9105)
    agreement = found.agreement.set_index("components")
    assert set(agreement["depths"]) == {3}  # all is best everywhere but never compared
    assert agreement.loc["fc1", "best_depth"] == "first" and agreement.loc["fc1", "agree"]  # first: most plastic here
    assert agreement.loc["mha", "best_depth"] == "last" and not agreement.loc["mha", "agree"]
    assert found.test["agree"] == 1 and found.test["expected"] == pytest.approx(1.0)
    assert set(found.comparison["predictor"]) >= {"in_network_mean", "plasticity_mean", "log_trainable_params"}
    assert found.family == 4  # in_network_mean, plasticity_mean and plasticity_max against the baseline; the count
    assert {f.name for f in found.files} == {
        "depth_table.csv",
        "depth_agreement.csv",
        "depth_criteria.csv",
        "plasticity_per_layer.csv",
    }
    text = describe_depth(found)
    assert "in-network (each layer on its real input)" in text
    assert "the most plastic depth was the best one for 1 of 3 subsets; by chance 1.00" in text
    assert "ranks the configurations (subset x depth)" in text


def test_without_a_score_there_is_no_depth_question(tmp_path):
    trials = depth_trials().drop(columns=["plasticity_mean", "plasticity_max"])
    found = analyze_depth(trials, tmp_path, num_blocks=4, n_boot=100)
    assert found.agreement.empty and depth_agreement(found.table, "plasticity_mean", 4).empty
    assert "no depth to compare" in describe_depth(found)
