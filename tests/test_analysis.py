"""Pure analysis functions: correlations, relative gain, the single-component table, plots."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from vitplast_tune.analysis import (
    correlations,
    plot_plasticity,
    plot_score_vs_accuracy,
    relative_gain,
    single_component_table,
)
from vitplast_tune.errors import UserError


def test_monotone_data_gives_spearman_one_with_a_tight_interval():
    x = np.arange(20.0)
    trials = pd.DataFrame({"score": x, "neg": -x, "val_acc": x**3 + 1})
    table = correlations(trials, ["score", "neg"], n_boot=200).set_index("predictor")
    assert table.loc["score", ["spearman", "spearman_low", "spearman_high", "kendall"]].tolist() == pytest.approx([1, 1, 1, 1])
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


def test_relative_gain():
    assert relative_gain(0.9, 0.8) == pytest.approx(0.125)
    series = relative_gain(pd.Series([0.8, 0.88]), 0.8)
    assert series.tolist() == pytest.approx([0.0, 0.1])
    np.testing.assert_allclose(relative_gain(np.array([0.5, 0.6]), np.array([0.5, 0.4])), [0.0, 0.5])
    with pytest.raises(UserError):
        relative_gain(0.5, 0.0)


def make_trials() -> pd.DataFrame:
    rows = []
    # (components, {lr: accuracy for seeds 0 and 1})
    plan = {
        "head": {1e-3: (0.50, 0.52), 1e-2: (0.60, 0.62)},
        "ln1": {1e-3: (0.70, 0.70), 1e-2: (0.65, 0.66)},
        "all": {1e-3: (0.90, 0.92), 1e-2: (0.80, 0.70)},
        "mha": {1e-3: (0.80, 0.81), 1e-2: (0.84, 0.82)},
        "mha+fc1": {1e-3: (0.99, 0.99), 1e-2: (0.99, 0.99)},
        "fc1": {1e-3: (0.75, 0.79), 1e-2: (0.70, np.nan)},
    }
    for components, by_lr in plan.items():
        for lr, accs in by_lr.items():
            for seed, acc in zip((0, 1), accs):
                rows.append({"components": components, "lr": lr, "seed": seed, "val_acc": acc, "test_acc": acc - 0.01})
    return pd.DataFrame(rows)


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


def plasticity_table() -> pd.DataFrame:
    rows = [{"component": "emb", "layer": 0, "plasticity": 0.3, "std": 0.01, "sem": 0.001, "n_pairs": 10}]
    for value, component in enumerate(["ln1", "mha", "ln2", "fc1", "fc2"]):
        for layer in range(3):
            rows.append({"component": component, "layer": layer, "plasticity": value + 0.1 * layer, "std": 0.1, "sem": 0.03, "n_pairs": 10})
    table = pd.DataFrame(rows)
    table.attrs["variant"] = "paper"
    return table


def is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(b"\x89PNG")


def test_plots_write_png_files(tmp_path):
    assert is_png(plot_plasticity(plasticity_table(), tmp_path / "plasticity.png"))
    trials = make_trials().dropna().assign(score=lambda t: t["val_acc"] * 2)
    assert is_png(plot_score_vs_accuracy(trials, "score", "val_acc", tmp_path / "sub" / "scatter.png"))
    assert is_png(plot_score_vs_accuracy(trials.drop(columns="lr"), "score", "val_acc", tmp_path / "plain.png"))


def test_importing_the_library_selects_no_backend_and_needs_no_ray_or_mlflow():
    code = (
        "import sys, vitplast_tune.analysis, vitplast_tune.plasticity\n"
        "bad = [m for m in ('matplotlib.pyplot', 'ray', 'mlflow') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
