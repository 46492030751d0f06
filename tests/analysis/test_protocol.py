"""The paper's protocol (analysis/protocol.py): relative gain, the lr chosen on validation, the single-component table,
the rank agreement with plasticity, the cross-dataset table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.analysis._tables import grid_trials, is_png, make_trials
from vitplast_tune.analysis.protocol import (
    best_lr_table,
    cross_dataset,
    describe_paper,
    paper_results,
    relative_gain,
    single_component_table,
)
from vitplast_tune.errors import UserError


def test_relative_gain():
    assert relative_gain(0.9, 0.8) == pytest.approx(0.125)
    series = relative_gain(pd.Series([0.8, 0.88]), 0.8)
    assert series.tolist() == pytest.approx([0.0, 0.1])
    np.testing.assert_allclose(relative_gain(np.array([0.5, 0.6]), np.array([0.5, 0.4])), [0.0, 0.5])
    with pytest.raises(UserError):
        relative_gain(0.5, 0.0)


def test_single_component_table_order_and_best_lr():
    table = single_component_table(make_trials())
    assert table["components"].tolist() == ["mha", "fc1", "ln1", "all", "head"]
    best = table.set_index("components")
    assert best.loc["mha", "lr"] == 1e-2 and best.loc["mha", "mean"] == pytest.approx(0.83)
    assert best.loc["mha", "std"] == pytest.approx(np.std([0.84, 0.82], ddof=1))
    assert best.loc["ln1", "lr"] == 1e-3 and best.loc["all", "lr"] == 1e-3
    assert best.loc["fc1", "n_runs"] == 3 and best.loc["fc1", "n_seeds"] == 2  # the NaN run is not counted
    assert best.loc["head", "mean"] == pytest.approx(0.61)
    assert best.loc["mha", "relative_gain"] == pytest.approx((0.83 - 0.61) / 0.61)
    # lr chosen on validation, reported on test
    on_test = single_component_table(make_trials(), "test_acc", select_by="val_acc").set_index("components")
    assert on_test.loc["mha", "lr"] == 1e-2 and on_test.loc["mha", "mean"] == pytest.approx(0.82)


def test_single_component_table_accepts_lists_and_rejects_unknown_names():
    trials = make_trials()
    trials["components"] = [("mha",) if c == "mha" else c for c in trials["components"]]
    assert "mha" in single_component_table(trials)["components"].tolist()
    trials.loc[0, "components"] = "mhaa"
    with pytest.raises(UserError, match="unknown component"):
        single_component_table(trials)


def test_best_lr_on_mean_validation_then_test_accuracy_and_gain_there():
    table = best_lr_table(grid_trials()).set_index("components")
    # mha: mean val 0.90 at 0.01 beats 0.75 at 0.1, although a single seed at 0.1 is higher
    assert table.loc["mha", "lr"] == 0.01 and table.loc["mha", "mean"] == pytest.approx(0.82)
    assert table.loc["mha", "std"] == pytest.approx(np.std([0.80, 0.82, 0.84], ddof=1))
    assert table.loc["fc1", "lr"] == 0.01 and table.loc["fc1", "mean"] == pytest.approx(0.75)  # not the better test lr
    assert table.loc["ln1", "lr"] == 0.1 and table.loc["ln1", "mean"] == pytest.approx(0.62)
    assert table.loc["head", "lr"] == 0.1 and table.loc["head", "mean"] == pytest.approx(0.50)
    assert table.loc["mha", "n_seeds"] == 3 and table.loc["mha", "n_lrs"] == 2
    assert table.loc["mha", "relative_gain"] == pytest.approx((0.82 - 0.50) / 0.50)
    assert table.loc["ln1", "relative_gain"] == pytest.approx(0.24)
    assert list(table.index) == ["mha", "fc1", "ln1", "head", "mha+fc1"]


def test_paper_results_rank_gain_beside_plasticity_and_write_files(tmp_path):
    results = paper_results(grid_trials(), tmp_path)
    a = results.agreement
    assert a["by_value"] == "mha > fc1 > ln1" and a["by_plasticity"] == "mha > fc1 > ln1"
    assert a["spearman"] == pytest.approx(1.0) and a["kendall"] == pytest.approx(1.0) and a["n"] == 3
    assert is_png(tmp_path / "gain_vs_plasticity.png")
    assert pd.read_csv(tmp_path / "paper_table.csv")["components"].tolist()[:2] == ["mha", "fc1"]
    assert "+64.00%" in describe_paper(results)  # mha: (0.82 - 0.50) / 0.50
    assert a["spearman_p"] == pytest.approx(2 / 6)  # three components in the same order: 2 of the 3! orderings as far
    assert "exact permutation p=0.33" in describe_paper(results) and "not a verdict" in describe_paper(results)


def test_cross_dataset_means_gains_and_pools_rank_agreement():
    a = best_lr_table(grid_trials())
    other = grid_trials()
    other.loc[other["components"] == "ln1", "test_acc"] += 0.5  # ln1 best on this dataset
    b = best_lr_table(other)
    plast = pd.Series({"mha": 3.0, "fc1": 2.0, "ln1": 1.0})
    gains, agreement = cross_dataset({"A": a, "B": b}, {"A": plast, "B": plast})
    gains = gains.set_index("components")
    assert gains.loc["mha", "mean_gain"] == pytest.approx(0.64)
    assert gains.loc["ln1", "mean_gain"] == pytest.approx(((0.62 - 0.5) / 0.5 + (1.12 - 0.5) / 0.5) / 2)
    rows = agreement.set_index("dataset")
    assert rows.loc["A", "spearman"] == pytest.approx(1.0) and rows.loc["B", "spearman"] == pytest.approx(-0.5)
    assert rows.loc["pooled", "by_value"] == "ln1 > mha > fc1"
