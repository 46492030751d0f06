"""A subset's scores from the plasticity and gradient tables (predictors/scores.py), on hand-made tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from vitplast_tune.errors import UserError
from vitplast_tune.predictors.scores import (
    aggregate_plasticity,
    contains_mha_or_fc,
    layer_table,
    log_trainable_params,
    num_blocks,
    subset_scores,
)

COUNTS = {"emb": 5000, "ln1": 10, "mha": 400, "ln2": 10, "fc1": 800, "fc2": 800}


def table() -> pd.DataFrame:
    """Two blocks; block components at plasticity ~1-5, the embedding at 250 (its ratio is to pixels)."""
    rows = [{"component": "emb", "layer": 0, "plasticity": 250.0}]
    for value, component in enumerate(["ln1", "mha", "ln2", "fc1", "fc2"], start=1):
        rows += [{"component": component, "layer": layer, "plasticity": value + layer} for layer in (0, 1)]
    return pd.DataFrame(rows)


def test_the_embeddings_pixel_scale_ratio_never_enters_a_subsets_scores():
    t = table()
    fc1 = subset_scores(t, "fc1", COUNTS)
    assert fc1 == {"plasticity_mean": 4.5, "plasticity_max": 4.5, "plasticity_weighted": 4.5}
    assert subset_scores(t, "emb+fc1", COUNTS) == fc1  # not (250 + 4.5) / 2, nor a max of 250
    everything = subset_scores(t, "all", COUNTS)
    assert everything["plasticity_mean"] == pytest.approx(np.mean([1.5, 2.5, 3.5, 4.5, 5.5]))
    assert everything["plasticity_max"] == 5.5
    weights = np.array([10, 400, 10, 800, 800])
    assert everything["plasticity_weighted"] == pytest.approx(np.array([1.5, 2.5, 3.5, 4.5, 5.5]) @ weights / 2020)
    assert all(math.isnan(v) for v in subset_scores(t, "emb", COUNTS).values())
    assert all(math.isnan(v) for v in subset_scores(t, "head", COUNTS).values())
    assert aggregate_plasticity(t).set_index("component")["rank"].isna()["emb"]  # and it is never ranked


def test_a_depth_scores_the_layers_it_trains():
    t = table()
    assert subset_scores(t, "mha+fc1", COUNTS, blocks=[1])["plasticity_mean"] == pytest.approx((3 + 5) / 2)
    assert num_blocks(t) == 2 and layer_table(t).loc["fc2", 1] == 6.0 and "emb" not in layer_table(t).index


def test_missing_rows_and_unknown_names_are_one_clear_error():
    with pytest.raises(UserError, match="no rows for mha"):
        subset_scores(table()[lambda x: x["component"] != "mha"], "mha+fc1", COUNTS)
    with pytest.raises(UserError, match="no count for fc1"):
        subset_scores(table(), "fc1", {"mha": 1})
    with pytest.raises(UserError, match='unknown component "attn"'):
        aggregate_plasticity(table().assign(component="attn"))


def test_the_baseline_and_the_binary_criterion():
    assert log_trainable_params(1_000_000) == pytest.approx(6.0)  # base 10
    assert np.isnan(log_trainable_params([0, -1])).all()
    assert contains_mha_or_fc("ln1+fc2") == 1.0 and contains_mha_or_fc("ln1+ln2") == 0.0


@pytest.fixture
def criteria_registry(monkeypatch):
    """The criteria registry, and the criteria a test registers removed after it."""
    from vitplast_tune.predictors import scores

    monkeypatch.setattr(scores, "CRITERIA", dict(scores.CRITERIA))
    return scores


def test_a_new_criterion_is_one_entry_scored_by_the_search_and_judged_by_the_lab(
    tmp_path, monkeypatch, criteria_registry
):
    """One ``register`` call: every trial's subset gets the criterion's score from the measured plasticity table,
    and the criteria lab judges it against the baseline, in its table, its file and its words."""
    from tests.analysis._tables import lab_trials, plasticity_table
    from vitplast_tune.analysis import subsets as lab
    from vitplast_tune.analysis import subsets_report
    from vitplast_tune.predictors.report import PlasticityReport, Predictors

    criteria_registry.register("plasticity_min", criteria_registry.PLASTICITY, lambda values, weights: values.min())

    measured = plasticity_table()
    report = PlasticityReport(measured, aggregate_plasticity(measured), tmp_path, meta={"component_params": COUNTS})
    trials = lab_trials().drop(columns=["good", "bad", "copy", "noise", "plasticity_mean"])
    scored = {s: Predictors(plasticity=report).scores(s) for s in trials["components"].unique()}
    trials = trials.join(pd.DataFrame.from_dict(scored, orient="index"), on="components")
    means = aggregate_plasticity(measured).set_index("component")["plasticity"]
    row = trials.iloc[0]  # a subset's score is the least plastic of its components
    assert row["plasticity_min"] == pytest.approx(min(means[c] for c in row["components"].split("+")))

    results = lab.criteria_lab({None: trials}, n_boot=200)  # the lab of a search's analysis, its default criteria
    lab.write_lab(results, tmp_path)
    judged = results[0].comparison.set_index("predictor").loc["plasticity_min"]
    assert judged["n"] == 31 and np.isfinite(judged["spearman"]) and judged["verdict"]
    written = pd.read_csv(tmp_path / "criteria.csv").set_index("predictor")
    assert written.loc["plasticity_min", "spearman"] == pytest.approx(judged["spearman"])
    assert "plasticity_min" in subsets_report.describe_lab(results)
