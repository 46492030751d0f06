"""The baselines' reference trials without Ray: the space key and its default, the rates swept, the configs, and a
trial's stage."""

from __future__ import annotations

import pytest

from vitplast_tune.errors import UserError
from vitplast_tune.space import load_space
from vitplast_tune.space.baselines import DEFAULT_RATES, references, stage_of, sweep
from vitplast_tune.space.distributions import Choice, Constant, LogUniform, RandInt, Uniform

SUBSETS = {"components": {"subsets": "any"}, "lr": {"loguniform": [1.0e-3, 1.0]}}


def test_a_tpe_search_over_components_has_baselines_unless_its_key_turns_them_off(tiny_space):
    tpe = load_space(tiny_space(name="tpe", algorithm="optuna", num_samples=20, parameters=SUBSETS))
    assert tpe.baselines == DEFAULT_RATES and tpe.total_trials == 20 + 2 * DEFAULT_RATES
    off = load_space(
        tiny_space(name="off", algorithm="optuna", num_samples=20, parameters=SUBSETS, baselines={"rates": 0})
    )
    assert off.baselines == 0 and off.total_trials == 20
    one = load_space(
        tiny_space(name="one", algorithm="optuna", num_samples=20, parameters=SUBSETS, baselines={"rates": 1})
    )
    assert one.total_trials == 22
    assert load_space(tiny_space(name="grid")).baselines == 0  # a grid lists its own configurations
    fixed = tiny_space(name="fixed", algorithm="optuna", num_samples=20, parameters={"components": "mha"})
    assert load_space(fixed).baselines == 0  # components not searched: nothing to compare
    few = tiny_space(name="few", algorithm="optuna", num_samples=11, parameters=SUBSETS)
    assert load_space(few).baselines == 0  # fewer than twice its 6 reference trials: none unless the key asks


@pytest.mark.parametrize(
    ("top", "said"),
    [
        ({"baselines": {"rates": -1}}, "baselines must be {rates: R}, R an integer >= 0 (0: none), got {'rates': -1}"),
        ({"baselines": 3}, "baselines must be {rates: R}"),
        ({"baselines": {"rates": 2, "seeds": 1}}, "baselines must be {rates: R}"),
        ({"baselines": {"rates": 2}, "algorithm": "grid"}, "baselines need algorithm: optuna, a components parameter"),
    ],
)
def test_a_bad_baselines_key_is_one_line(tiny_space, top, said):
    with pytest.raises(UserError) as refused:
        load_space(tiny_space(**{"algorithm": "optuna", "num_samples": 20, "parameters": SUBSETS, **top}))
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_the_rates_spread_over_the_rate_dimension():
    assert sweep(LogUniform("lr", 1e-3, 1.0), 3) == [0.00316, 0.0316, 0.316]  # the middle of each third, in log
    assert sweep(Uniform("lr", 0.0, 0.6), 3) == [0.1, 0.3, 0.5]
    assert sweep(Choice("lr", (1.0, 0.01, 0.03, 0.1, 0.3)), 3) == [0.01, 0.1, 1.0]
    assert sweep(Choice("lr", (0.3, 0.1)), 3) == [0.1, 0.3]  # fewer listed than asked: each once
    assert sweep(Constant("lr", 0.2), 3) == [0.2] and sweep(None, 3) == [None] and sweep(RandInt("lr", 1, 4), 2) == [1]
    assert sweep(LogUniform("lr", 1e-3, 1.0), 0) == [] and sweep(Choice("lr", (0.1, "fast")), 3) == [0.1]


def test_the_reference_trials_are_both_baselines_at_each_rate_marked_and_staged(tiny_space):
    parameters = {**SUBSETS, "depth": {"choice": ["first", "last"]}, "lora_rank": {"choice": [8, 4]}}
    spec = load_space(tiny_space(algorithm="optuna", num_samples=20, parameters=parameters, baselines={"rates": 2}))
    made = references(spec.parameters, spec.baselines)
    assert [(c["components"], c["lr"], c["depth"], c["lora_rank"]) for c in made] == [
        ("all", 0.00562, "all", 8),
        ("head", 0.00562, "all", 8),
        ("all", 0.178, "all", 8),
        ("head", 0.178, "all", 8),
    ]
    assert [c["reference"] for c in made] == [{"index": i, "of": 4} for i in (1, 2, 3, 4)]
    assert {stage_of(c) for c in made} == {"baseline"} and stage_of({"lr": 0.1}) == "search"
    assert stage_of({"finalist": {"index": 1, "of": 3}}) == "finalist"
