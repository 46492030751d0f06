"""The finalists stage without Ray: the space key, and which configurations its trials train (``choose``), from the
search's ended trials."""

from __future__ import annotations

import pytest

from vitplast_tune.errors import UserError
from vitplast_tune.space import load_space
from vitplast_tune.space.finalists import OFF, Ended, Finalists, choose, ended, expected_trials, identity


def test_a_space_reads_its_finalists_key_and_has_none_without_it(tiny_space):
    assert load_space(tiny_space(name="none")).finalists == OFF
    spec = load_space(tiny_space(name="some", finalists={"top": 2, "seeds": 3}))
    assert spec.finalists == Finalists(2, 3) and spec.finalists.on and spec.finalists.trials == (2 + 2) * 3
    off = load_space(tiny_space(name="off", finalists={"top": 0, "seeds": 3})).finalists
    assert not off.on and off.trials == 0


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({"top": -1, "seeds": 2}, "finalists top must be an integer >= 0 (0 turns the stage off), got -1"),
        ({"top": 2, "seeds": "3"}, "finalists seeds must be an integer >= 0 (0 turns the stage off), got '3'"),
        ({"top": 2, "seeds": 1.5}, "finalists seeds must be an integer >= 0"),
        ({"top": True, "seeds": 2}, "finalists top must be an integer >= 0"),
        ({"top": 2}, "finalists must be {top: K, seeds: N}"),
        ([3, 3], "finalists must be {top: K, seeds: N}"),
        ({"top": 2, "seeds": 2, "rate": 1}, "finalists must be {top: K, seeds: N}"),
    ],
)
def test_a_bad_finalists_key_is_one_line(tiny_space, value, said):
    with pytest.raises(UserError) as refused:
        load_space(tiny_space(finalists=value))
    assert said in str(refused.value) and "\n" not in str(refused.value)


def _trial(components: str, lr: float, acc: float | None, **more) -> Ended:
    return Ended({"components": components, "lr": lr, "optimizer": "sgd", "train_mha": True, **more}, acc)


def test_the_finalists_are_the_best_distinct_configurations_then_both_baselines_on_every_seed():
    main = [
        _trial("mha", 0.1, 0.90),
        _trial("fc1", 0.2, 0.95),
        _trial("mha", 0.1, 0.97, seed=7),  # the same configuration as the first: its seed is no part of it
        _trial("all", 0.05, 0.99),  # full finetuning is a baseline, not one of the top
        _trial("ln1", 0.3, None),  # failed: never a finalist
        _trial("fc2", 0.4, 0.80),
    ]
    configs = choose(main, Finalists(top=2, seeds=2), seeds=[1, 2])
    assert [(c["components"], c["lr"], c["seed"]) for c in configs] == [
        ("mha", 0.1, 1),
        ("fc1", 0.2, 1),
        ("all", 0.05, 1),
        ("head", 0.05, 1),  # no probe trial: the best trial's rate (the best is full finetuning's)
        ("mha", 0.1, 2),
        ("fc1", 0.2, 2),
        ("all", 0.05, 2),
        ("head", 0.05, 2),
    ]
    firsts = configs[:4]
    assert [c["finalist"]["lr_from"] for c in firsts] == ["own", "own", "own", "best"]
    assert [c["finalist"]["index"] for c in configs] == [1, 2, 3, 4] * 2
    assert {c["finalist"]["of"] for c in configs} == {8} and [c["seed"] for c in configs] == [1] * 4 + [2] * 4
    assert all("train_mha" not in c for c in configs)  # Optuna's encodings left out: the subset says it
    assert identity(configs[0]) == identity(main[0].config) == identity(main[2].config)
    assert expected_trials(main, [], Finalists(2, 2)) == 8 == expected_trials([], configs[:1], Finalists(2, 2))


def test_a_baseline_with_a_depth_is_no_baseline_and_nothing_finished_makes_no_finalists():
    main = [_trial("all", 0.1, 0.9, depth="last"), _trial("mha", 0.2, 0.8, depth="first")]
    configs = choose(main, Finalists(top=3, seeds=1), seeds=[5])
    assert [(c["components"], c.get("depth")) for c in configs] == [
        ("all", "last"),  # the last third of the blocks: one of the top, not full finetuning
        ("mha", "first"),
        ("all", "all"),  # full finetuning in every block, at the best's rate
        ("head", "all"),
    ]
    assert configs[2]["lr"] == 0.1 and configs[2]["finalist"]["lr_from"] == "best"
    assert choose([_trial("mha", 0.1, None)], Finalists(1, 1), [1]) == []
    assert choose(main, OFF, [1]) == []


def test_a_trial_that_failed_diverged_or_went_over_budget_is_not_ranked():
    config = {"components": "mha", "lr": 0.1}
    assert ended(config, {"best_val_acc": 0.9}).best_val_acc == 0.9
    assert ended(config, {"best_val_acc": 0.9}, error=True).best_val_acc is None
    assert ended(config, {"best_val_acc": 0.9, "diverged": 1}).best_val_acc is None
    assert ended(config, {"best_val_acc": float("nan"), "over_budget": 1}).best_val_acc is None
    assert ended(config, None).best_val_acc is None
