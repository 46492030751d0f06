"""The finalists' answer by the one-standard-error rule, held on fixed synthetic finalists (ties, a seed failed, a
baseline best, a single seed, all within one SE), and the trial table's stage and seed columns."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.records.answer import answer_lines, answer_of
from vitplast_tune.records.finalists import FinalAnswer, final_answer
from vitplast_tune.records.table import search_trials, trial_table

PARAMS = {"all": 400_000, "head": 1_000, "mha+fc1": 200_000, "fc1": 100_000, "fc2": 100_000, "mha": 150_000}


def rows(index, components, vals, tests=None, lr=0.1, lr_from="own", seeds=(1, 2, 3), failed=()):
    """One finalist configuration's rows: a best validation accuracy per seed (None: that seed diverged)."""
    tests = tests or [v - 0.01 if v is not None else None for v in vals]
    return [
        {
            "trial_id": f"{index}-{seed}",
            "components": components,
            "lr": lr,
            "stage": "finalist",
            "seed": seed,
            "finalist": index,
            "lr_from": lr_from,
            "best_val_acc": val,
            "test_acc": test,
            "trainable_params": PARAMS[components],
            "step": 100,
            "max_steps": 100,
            "diverged": val is None or seed in failed,
            "error": None,
        }
        for seed, val, test in zip(seeds, vals, tests)
    ]


def table(*configurations, search=()) -> pd.DataFrame:
    found = [row for c in configurations for row in c]
    searched = [{**r, "stage": "search", "seed": 0, "finalist": None, "lr_from": None} for r in search]
    return pd.DataFrame(searched + found)


BASELINES = (
    rows(3, "all", [0.955, 0.965, 0.975], tests=[0.95, 0.96, 0.97]),  # the best mean, 96.5%, its SE 0.58 points
    rows(4, "head", [0.50, 0.52, 0.51], tests=[0.49, 0.51, 0.50], lr_from="best"),
)


def test_the_fewest_parameters_within_one_se_of_the_best_mean_is_the_answer():
    trials = table(
        rows(1, "mha+fc1", [0.95, 0.96, 0.97], tests=[0.955, 0.965, 0.975]),  # 96.0%: within one SE of 96.5%
        rows(2, "fc1", [0.94, 0.955, 0.96]),  # 95.2%: beyond it, though cheaper
        *BASELINES,
    )
    found = final_answer(trials)
    assert isinstance(found, FinalAnswer) and found.best.name == "all at lr 0.1"
    assert found.chosen.name == "mha+fc1 at lr 0.1" and [t.name for t in found.tied] == ["all at lr 0.1"]
    full, probe = found.gains
    assert (full.kind, full.paired, full.n) == ("compared", True, 3)
    assert full.points == pytest.approx(0.5) and full.half == pytest.approx(0.0)  # +0.5 on every seed
    assert probe.points == pytest.approx(46.5) and probe.half > 0
    assert found.line == (
        "Answer: finetune mha+fc1 at lr 0.1: test accuracy 96.50% ± 1.00 (SD over 3 seeds); +0.50 points over full "
        "finetuning (95% interval +0.50 to +0.50, paired by seed, n=3); +46.50 points over the linear probe (95% "
        "interval +45.37 to +47.63, paired by seed, n=3); not distinguishable from all at lr 0.1 (within one "
        "standard error of the best mean validation accuracy)."
    )
    lines = answer_lines(trials)
    assert lines[0] == found.line and lines[-1].startswith("  Plasticity: not measured")
    assert (
        "the one with the fewest trainable parameters (200,000) whose mean validation accuracy (96.00%) is "
        in (lines[1])
        and "within one standard error (0.58 points) of the best mean (96.50%, all at lr 0.1)" in lines[1]
    )
    assert lines[2] == (
        "  The baselines' rates: full finetuning at its own best trial's rate; the linear probe at the best trial's "
        "rate (the search ran none)."
    )
    assert answer_of(trials) == found


def test_a_tie_goes_to_the_fewer_parameters_then_the_first():
    trials = table(
        rows(1, "mha", [0.96, 0.97, 0.98]),
        rows(2, "fc1", [0.96, 0.97, 0.98]),  # the same means as mha, fewer parameters
        rows(5, "fc2", [0.96, 0.97, 0.98]),  # as fc1, and later
        *BASELINES,
    )
    found = final_answer(trials)
    assert found is not None and found.chosen.name == "fc1 at lr 0.1"
    assert [t.name for t in found.tied] == ["mha at lr 0.1", "fc2 at lr 0.1", "all at lr 0.1"]  # all: 0.5 below


def test_a_failed_seed_is_left_out_and_said():
    trials = table(rows(1, "mha", [0.99, None, 0.98]), *BASELINES)
    found = final_answer(trials)
    assert found is not None and found.chosen.name == "mha at lr 0.1" and found.chosen.n == 2
    assert found.chosen.mean_val == pytest.approx(0.985)
    full = found.gains[0]
    assert not full.paired and full.n == 2  # its seeds differ from full finetuning's: a difference of means
    assert "  Left out (failed or diverged): mha at lr 0.1 seed 2." in answer_lines(trials)
    assert "SD over 2 seeds" in found.line and "unpaired, n=2" in found.line


def test_a_baseline_can_be_the_answer():
    trials = table(rows(1, "mha", [0.90, 0.91, 0.92]), *BASELINES)
    found = final_answer(trials)
    assert found is not None and found.chosen.name == "all at lr 0.1" and found.tied == ()
    assert found.gains[0].said() == "it is full finetuning"
    assert "; it is full finetuning; " in found.line and found.line.endswith(
        "; no other finalist within one standard error of its mean validation accuracy."
    )


def test_one_seed_has_no_standard_error_and_the_answer_says_so():
    one = (1,)
    trials = table(
        rows(1, "fc1", [0.97], seeds=one),
        rows(3, "all", [0.96], seeds=one),
        rows(4, "head", [0.5], seeds=one),
    )
    found = final_answer(trials)
    assert found is not None and found.chosen.name == "fc1 at lr 0.1" and math.isnan(found.best.se_val)
    assert "test accuracy 96.00% (one seed: no spread)" in found.line and "one seed: no interval" in found.line
    assert "with one seed that trained, the best has no standard error" in answer_lines(trials)[1]


def test_when_all_are_within_one_se_the_cheapest_wins_and_a_failed_baseline_is_said():
    trials = table(
        rows(1, "mha", [0.80, 0.95, 0.90]),
        rows(3, "all", [0.85, 0.90, 0.95]),
        rows(4, "head", [0.84, 0.89, 0.94]),  # the cheapest, within one SE (2.9 points) of the best mean
    )
    found = final_answer(trials)
    assert found is not None and found.chosen.name == "head at lr 0.1" and len(found.tied) == 2
    assert "it is the linear probe" in found.line
    failed = table(rows(1, "mha", [0.9, 0.91, 0.92]), BASELINES[0], rows(4, "head", [None, None, None]))
    said = final_answer(failed)
    assert said is not None and said.gains[1].said() == "the linear probe: every seed failed, not compared"


def test_without_finalists_the_answer_is_the_best_trial_of_the_search():
    search = [
        {"trial_id": "1", "components": "fc1", "lr": 0.1, "best_val_acc": 0.9, "val_acc": 0.9, "test_acc": 0.89}
        | {"trainable_params": 100_000, "step": 100, "max_steps": 100, "diverged": False, "error": None},
    ]
    trials = table(search=search)
    assert final_answer(trials) is None
    assert answer_lines(trials)[0].startswith("Answer: finetune fc1 at lr 0.1 (90.00% best validation accuracy")
    every_seed_failed = table(rows(1, "mha", [None, None, None]), search=search)
    assert final_answer(every_seed_failed) is None
    assert answer_lines(every_seed_failed)[0].endswith("the best of 1 trials.")  # the search's trials alone


def test_the_trial_table_says_each_trials_stage_seed_and_finalist():
    def result(trial_id, config):
        metrics = {"trial_id": trial_id, "best_val_acc": 0.9, "step": 16}
        return SimpleNamespace(config=config, metrics=metrics, error=None, metrics_dataframe=None)

    finalist = {"index": 2, "of": 6, "lr_from": "best"}
    grid = [
        result("a", {"components": "mha", "lr": 0.1, "train_mha": True}),
        result("b", {"components": "head", "lr": 0.1, "seed": 3, "finalist": finalist}),
    ]
    found = trial_table(grid, FinetuneConfig(seed=0))
    assert list(found["stage"]) == ["search", "finalist"] and list(found["seed"]) == [0, 3]
    assert pd.isna(found["finalist"][0]) and found["finalist"][1] == 2
    assert pd.isna(found["lr_from"][0]) and found["lr_from"][1] == "best"
    assert list(search_trials(found)["trial_id"]) == ["a"]


def test_the_best_model_is_the_trial_of_the_configuration_the_answer_chose_not_the_best_single_trial():
    from vitplast_tune.records.finalists import answer_trial
    from vitplast_tune.space import load_space

    spec = load_space("component_subsets")
    lucky = [{**r, "trial_id": "lucky", "components": "fc2", "best_val_acc": 0.999, "test_acc": 0.9} for r in search()]
    trials = table(
        rows(1, "mha+fc1", [0.95, 0.97, 0.96], tests=[0.955, 0.965, 0.975]),  # the answer; its best seed is 2
        rows(2, "fc1", [0.94, 0.955, 0.98]),  # the best finalist trial (seed 3), not within one SE by its mean
        *BASELINES,
        search=lucky,  # the best trial of all, one seed of one configuration
    )
    found = answer_trial(trials, spec)
    assert final_answer(trials).chosen.index == 1
    assert list(found["trial_id"]) == ["1-2"]
    assert list(answer_trial(table(search=lucky), spec)["trial_id"]) == ["lucky"]  # no finalists: the best trial


def search() -> list[dict]:
    """A trial of the search, as ``table`` takes one."""
    return [
        {"trial_id": "1", "components": "fc1", "lr": 0.1, "best_val_acc": 0.9, "val_acc": 0.9, "test_acc": 0.89}
        | {"trainable_params": 100_000, "step": 100, "max_steps": 100, "diverged": False, "error": None}
    ]
