"""Which settings matter: fANOVA importance and its direction on synthetic trials whose truth is known."""

import numpy as np
import pandas as pd
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution

from vitplast_tune.analysis.importance import describe_importance, parameter_importance
from vitplast_tune.components import COMPONENTS

FLAGS = [f"train_{c}" for c in COMPONENTS]
DISTRIBUTIONS = {
    **{flag: CategoricalDistribution([False, True]) for flag in FLAGS},
    "lr": FloatDistribution(1e-3, 1.0, log=True),
}


def synthetic(n=60, seed=0):
    """Random subsets and learning rates; accuracy 0.70, plus 0.20 when fc1 trains, plus a little noise."""
    rng = np.random.default_rng(seed)
    params = pd.DataFrame({flag: rng.random(n) < 0.5 for flag in FLAGS})
    params["lr"] = 10 ** rng.uniform(-3, 0, n)
    accuracy = 0.70 + 0.20 * params["train_fc1"] + rng.normal(0, 0.01, n)
    return params, pd.Series(accuracy, name="val_acc_common")


def test_the_flag_that_drives_accuracy_ranks_first_with_a_positive_direction():
    params, accuracy = synthetic()
    found = parameter_importance(params, DISTRIBUTIONS, accuracy, seed=0)
    table = found.table.set_index("parameter")
    assert found.n == 60 and list(table.index)[0] == "train_fc1"
    assert table.loc["train_fc1", "importance"] > 0.8  # nearly all the variance is fc1's
    assert table["importance"].sum() == pytest.approx(1.0)
    expected = accuracy[params["train_fc1"]].mean() - accuracy[~params["train_fc1"]].mean()  # about +0.20
    assert table.loc["train_fc1", "effect"] == pytest.approx(expected) and expected > 0.18
    assert table.loc["train_fc1", "effect_kind"] == "with - without"
    assert table.loc["lr", "effect_kind"] == "spearman" and abs(table.loc["lr", "effect"]) < 0.3  # lr does nothing
    text = describe_importance(found)
    assert text.splitlines()[1].split()[:2] == ["train_fc1", f"{table.loc['train_fc1', 'importance']:.3f}"]
    assert f"{100 * expected:+6.2f} pts with it" in text


def test_a_learning_rate_that_drives_accuracy_ranks_first_with_its_spearman():
    params, _ = synthetic(seed=1)
    accuracy = pd.Series(0.5 + 0.1 * np.log10(params["lr"]) + np.random.default_rng(2).normal(0, 0.005, 60))
    found = parameter_importance(params, DISTRIBUTIONS, accuracy)
    assert found.table.iloc[0]["parameter"] == "lr" and found.table.iloc[0]["effect"] > 0.95


def test_too_few_trials_or_a_constant_target_give_a_note_not_numbers():
    params, accuracy = synthetic(n=4)
    few = parameter_importance(params, DISTRIBUTIONS, accuracy)
    assert few.table.empty and few.note == "too few trials (4 < 5)" and "too few trials" in describe_importance(few)
    params, accuracy = synthetic()
    flat = parameter_importance(params, DISTRIBUTIONS, accuracy * 0 + 0.5)
    assert flat.table.empty and flat.note == "the target is the same in every trial"
    nan = accuracy.copy()
    nan[:57] = np.nan  # trials without a value at the target do not count
    assert parameter_importance(params, DISTRIBUTIONS, nan).n == 3


def test_over_the_cap_fanova_fits_a_seeded_sample_and_says_so_while_directions_use_every_trial():
    params, accuracy = synthetic(n=80, seed=3)
    capped = parameter_importance(params, DISTRIBUTIONS, accuracy, seed=0, max_trials=50)
    again = parameter_importance(params, DISTRIBUTIONS, accuracy, seed=0, max_trials=50)
    full = parameter_importance(params, DISTRIBUTIONS, accuracy, seed=0, max_trials=80)
    assert (capped.n, capped.fitted, full.fitted) == (80, 50, None)
    assert capped.table.equals(again.table)  # the sample is seeded
    table = capped.table.set_index("parameter")
    assert table.index[0] == "train_fc1" and table["importance"].sum() == pytest.approx(1.0)
    assert not np.isclose(
        table.loc["train_fc1", "importance"], full.table.set_index("parameter").loc["train_fc1", "importance"]
    )
    expected = accuracy[params["train_fc1"]].mean() - accuracy[~params["train_fc1"]].mean()  # over all 80 trials
    assert table.loc["train_fc1", "effect"] == pytest.approx(expected)
    assert (
        table.loc["train_fc1", "detail"]
        == f"{int(params['train_fc1'].sum())} with, {int((~params['train_fc1']).sum())} without"
    )
    assert "of val_acc_common, 50 of 80 trials (a seeded sample);" in describe_importance(capped)
    assert "of val_acc_common, 80 trials;" in describe_importance(full)
