"""Pure analysis functions: correlations, relative gain, the single-component table, plots."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from vitplast_tune.analysis.correlation import (
    MIN_POINTS,
    bca_from_resamples,
    compare_predictors,
    compare_with_baseline,
    correlations,
    interval,
    kendall,
    partial_correlations,
    partial_spearman,
    spearman,
)
from vitplast_tune.analysis.lab import criteria_comparison, criteria_winner, describe_criteria, subset_table
from vitplast_tune.analysis.plots import plot_score_vs_accuracy
from vitplast_tune.analysis.protocol import (
    best_lr_table,
    cross_dataset,
    describe_paper,
    paper_results,
    relative_gain,
    single_component_table,
)
from vitplast_tune.analysis.trials import analyze_trials, describe_correlations
from vitplast_tune.errors import UserError
from vitplast_tune.predictors.report import plot_plasticity


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
            rows.append(
                {
                    "component": component,
                    "layer": layer,
                    "plasticity": value + 0.1 * layer,
                    "std": 0.1,
                    "sem": 0.03,
                    "n_pairs": 10,
                }
            )
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
        "import sys, vitplast_tune.analysis.trials, vitplast_tune.vit.plasticity\n"
        "bad = [m for m in ('matplotlib.pyplot', 'ray', 'mlflow') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


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


def grid_trials() -> pd.DataFrame:
    """A hand-made grid: 3 seeds x 2 lrs; best_val_acc picks the lr, test_acc is reported there."""
    plan = {  # components: {lr: (best_val_acc per seed, test_acc per seed)}
        "head": {0.01: ((0.50, 0.52, 0.54), (0.40, 0.42, 0.44)), 0.1: ((0.60, 0.60, 0.60), (0.50, 0.50, 0.50))},
        "mha": {0.01: ((0.90, 0.90, 0.90), (0.80, 0.82, 0.84)), 0.1: ((0.95, 0.40, 0.90), (0.99, 0.99, 0.99))},
        "ln1": {0.01: ((0.70, 0.70, 0.70), (0.55, 0.55, 0.55)), 0.1: ((0.80, 0.80, 0.80), (0.60, 0.62, 0.64))},
        "fc1": {0.01: ((0.85, 0.85, 0.85), (0.75, 0.75, 0.75)), 0.1: ((0.80, 0.80, 0.80), (0.90, 0.90, 0.90))},
        "mha+fc1": {0.01: ((0.99, 0.99, 0.99), (0.90, 0.90, 0.90)), 0.1: ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))},
    }
    plasticity = {"mha": 3.0, "fc1": 2.0, "ln1": 1.0, "mha+fc1": 2.5}
    params = {"head": 10, "mha": 1000, "ln1": 20, "fc1": 2000, "mha+fc1": 3000}
    rows = []
    for components, by_lr in plan.items():
        for lr, (vals, tests) in by_lr.items():
            for seed, v, t in zip((0, 42, 3407), vals, tests):
                rows.append(
                    {
                        "components": components,
                        "lr": lr,
                        "seed": seed,
                        "best_val_acc": v,
                        "test_acc": t,
                        "plasticity_mean": plasticity.get(components, np.nan),
                        "trainable_params": params[components],
                    }
                )
    return pd.DataFrame(rows)


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


def test_criteria_lab_compares_each_predictor_with_the_parameter_count():
    trials = grid_trials()
    extra = pd.DataFrame({"grad_norm": {"mha": 5.0, "fc1": 4.0, "ln1": 1.0, "mha+fc1": 6.0}})
    subsets = subset_table(trials, extra).set_index("components")
    assert subsets.loc["mha+fc1", "mean"] == pytest.approx(0.90) and subsets.loc["mha+fc1", "lr"] == 0.01
    assert subsets.loc["ln1", "contains_mha_or_fc"] == 0 and subsets.loc["fc1", "contains_mha_or_fc"] == 1
    assert subsets.loc["mha", "log_trainable_params"] == pytest.approx(np.log(1000))
    assert subsets.loc["fc1", "grad_norm"] == 4.0
    comparison = criteria_comparison(subsets.reset_index(), n_boot=200, min_trials=4).set_index("predictor")
    assert comparison.loc["grad_norm", "spearman"] == pytest.approx(1.0)  # 0.90 > 0.82 > 0.75 > 0.62 > 0.50 (head: NaN)
    assert comparison.loc["grad_norm", "n"] == 4
    assert comparison.loc["log_trainable_params", "verdict"] == ""
    assert "diff_vs_baseline" in comparison and "kendall_low" in comparison
    fake = pd.DataFrame(
        {
            "predictor": ["a", "b"],
            "spearman": [0.9, 0.5],
            "verdict": ["no clear difference", "better"],
            "diff_vs_baseline": [0.1, 0.4],
            "diff_low": [-0.1, 0.1],
            "diff_high": [0.3, 0.7],
            "n": [31, 31],
        }
    )
    assert criteria_winner(fake).startswith("b ranks the subsets best") and "(n=31)" in criteria_winner(fake)
    assert criteria_winner(fake.assign(verdict="worse")).startswith("No predictor")


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
    lab = criteria_comparison(frame.rename(columns={"y": "mean"}), ["p"], n_boot=300).set_index("predictor")
    assert lab.loc["p", "n"] == 12 and lab.loc["p", "diff_vs_baseline"] == pytest.approx(row["diff_vs_baseline"])
    assert f"n={12:<3}" in describe_criteria(lab.reset_index())


def test_an_interval_that_cannot_be_formed_is_undetermined_not_no_clear_difference():
    """A predictor that differs in one row of 12 is constant in (11/12)^12 = 35% of the resamples, far more than
    MAX_DEGENERATE: its rank correlation has no interval, and the comparison says so."""
    y = np.arange(12.0)
    frame = pd.DataFrame({"one": [1.0] * 11 + [0.0], "base": y[::-1] + 0.5 * np.sin(y), "y": y})
    c = compare_predictors(frame, "one", "base", "y", n_boot=400, min_points=5)
    assert np.isnan(c["diff_low"]) and np.isnan(c["diff_high"]) and np.isfinite(c["diff"])
    assert c["verdict"] == "undetermined"
    table = compare_with_baseline(frame, ["one", "base"], "base", "y", n_boot=400, min_points=5)
    text = describe_criteria(table)
    assert "[undetermined]" in text and "undetermined" in text.splitlines()[1]
    assert "no clear difference" not in text


def test_below_the_minimum_the_figures_are_shown_without_a_verdict():
    rng = np.random.default_rng(3)
    n = MIN_POINTS - 2
    y = np.arange(float(n))
    frame = pd.DataFrame({"good": y, "log_trainable_params": rng.permutation(y), "y": y})
    c = compare_predictors(frame, "good", "log_trainable_params", "y", n_boot=300)
    assert c["verdict"] == f"no verdict (n < {MIN_POINTS})" and np.isfinite(c["diff"])
    table = compare_with_baseline(frame, ["good", "log_trainable_params"], "log_trainable_params", "y", n_boot=300)
    text = describe_criteria(table)
    assert "Spearman +1.00" in text and f"no verdict (n < {MIN_POINTS})" in text
    assert criteria_winner(table).startswith("No verdict")
    big = pd.DataFrame(
        {"good": np.arange(40.0), "log_trainable_params": rng.permutation(np.arange(40.0)), "y": np.arange(40.0)}
    )
    assert compare_predictors(big, "good", "log_trainable_params", "y", n_boot=300)["verdict"] == "better"


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


def depth_trials():
    """mha (full and LoRA) and fc1 at three depths, two learning rates, two seeds; mha is best where it is most
    plastic (last), fc1 is best first although it is most plastic last."""
    rows = []
    accuracy = {("mha", "first"): 0.80, ("mha", "middle"): 0.85, ("mha", "last"): 0.90, ("mha:lora", "first"): 0.70}
    accuracy.update({("mha:lora", "middle"): 0.75, ("mha:lora", "last"): 0.78, ("fc1", "first"): 0.95})
    accuracy.update({("fc1", "middle"): 0.90, ("fc1", "last"): 0.85})
    plasticity = {"first": 1.0, "middle": 2.0, "last": 3.0}
    for (components, depth), acc in accuracy.items():
        for lr in (0.1, 0.3):
            for seed in (0, 1):
                rows.append(
                    {
                        "components": components,
                        "depth": depth,
                        "lr": lr,
                        "seed": seed,
                        "best_val_acc": acc + (0.01 if lr == 0.3 else 0.0),
                        "test_acc": acc + (0.01 if lr == 0.3 else 0.0) + 0.001 * seed,
                        "plasticity_mean": plasticity[depth] * (2 if components.startswith("fc1") else 1),
                        "plasticity_max": plasticity[depth],
                        "trainable_params": 1000
                        * (3 if depth == "middle" else 1)
                        * (0.1 if "lora" in components else 1),
                    }
                )
    return pd.DataFrame(rows)


def test_depth_analysis_asks_whether_the_most_plastic_depth_is_the_best(tmp_path):
    from vitplast_tune.analysis.depth import analyze_depth, describe_depth, varies_depth

    trials = depth_trials()
    assert varies_depth(trials) and not varies_depth(trials.assign(depth="all"))
    layers = pd.DataFrame({0: [1.0, 2.0], 1: [1.5, 2.5]}, index=pd.Index(["mha", "fc1"], name="component"))
    found = analyze_depth(trials, tmp_path, layers=layers, n_boot=200)
    table = found.table.set_index(["components", "depth"])
    assert table.loc[("mha", "last"), "lr"] == 0.3 and table.loc[("mha", "last"), "mean"] == pytest.approx(0.9105)
    assert table.loc[("fc1", "first"), "plasticity_mean"] == 2.0 and table.loc[("mha", "middle"), "n_seeds"] == 2
    agreement = found.agreement.set_index("components")
    assert agreement.loc["mha", "best_depth"] == "last" and agreement.loc["mha", "agree"]
    assert agreement.loc["fc1", "best_depth"] == "first" and not agreement.loc["fc1", "agree"]
    assert agreement.loc["fc1", "spearman"] == pytest.approx(-1.0) and agreement.loc["mha:lora", "spearman"] == 1.0
    assert set(found.comparison["predictor"]) == {"plasticity_mean", "plasticity_max", "log_trainable_params"}
    assert {f.name for f in found.files} == {
        "depth_table.csv",
        "depth_agreement.csv",
        "depth_criteria.csv",
        "plasticity_per_layer.csv",
    }
    text = describe_depth(found)
    assert "Plasticity per component (rows) and layer" in text and "Where to finetune" in text
    assert "the most plastic depth was the best one for 2 of 3 subsets (by chance: 1.0 of 3)" in text
    assert "ranks the configurations (subset x depth)" in text


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
