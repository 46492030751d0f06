"""The finalists stage in a plan: the flags over the space file's key, where it is refused or turned off, its seeds,
what a resume keeps, and what the dry run counts and estimates."""

from __future__ import annotations

from dataclasses import replace

import pytest
from _commands import refused

from vitplast_tune.errors import UserError
from vitplast_tune.plan import SearchOptions, prepare
from vitplast_tune.plan.estimate import Timing, describe_trials, wall_range
from vitplast_tune.plan.finalists import finalist_seeds
from vitplast_tune.space.finalists import OFF, Finalists

OPTUNA = {"algorithm": "optuna", "num_samples": 6, "parameters": {"lr": {"loguniform": [0.01, 0.1]}}}


def options(tmp_path, space, **kw):
    return SearchOptions(space=str(space), storage=str(tmp_path / "results"), plasticity=False, **kw)


def test_the_flags_set_the_stage_over_the_space_files_and_the_plan_records_it(tmp_path, tiny_space):
    space = tiny_space(finalists={"top": 2, "seeds": 3}, **OPTUNA)
    assert prepare(options(tmp_path, space, name="a")).spec.finalists == Finalists(2, 3)
    plan = prepare(options(tmp_path, space, name="b", finalists_seeds=2))
    assert plan.spec.finalists == Finalists(2, 2) and plan.record("run")["finalists"] == {"top": 2, "seeds": 2}
    assert prepare(options(tmp_path, space, name="c", finalists_top=0)).spec.finalists == OFF
    unset = tiny_space(name="unset", **OPTUNA)  # no key: no stage, unless the flags ask
    assert prepare(options(tmp_path, unset, name="d")).spec.finalists == OFF
    assert prepare(options(tmp_path, unset, name="e", finalists_top=1, finalists_seeds=2)).spec.finalists.trials == 6


def test_a_space_files_stage_too_big_for_its_trials_or_off_its_objective_is_turned_off_and_said(tmp_path, tiny_space):
    space = tiny_space(finalists={"top": 3, "seeds": 2}, **OPTUNA)
    plan = prepare(options(tmp_path, space, name="few", num_samples=5))  # 5 trials, 3 + 2 configurations
    assert plan.spec.finalists == OFF
    assert any("no finalists stage (5 trial(s) are no more than its 5 configurations)" in n for n in plan.notes)
    asked = prepare(options(tmp_path, space, name="asked", num_samples=5, finalists_top=3))  # asked: it runs
    assert asked.spec.finalists == Finalists(3, 2)
    cost = prepare(options(tmp_path, space, name="cost", objective="accuracy_per_gpu_hour"))
    assert cost.spec.finalists == OFF and any("optimises val_acc_per_gpu_hour" in n for n in cost.notes)
    with pytest.raises(UserError, match="ranks and judges by validation accuracy"):
        prepare(options(tmp_path, space, name="x", objective="accuracy_per_gpu_hour", finalists_seeds=2))


def test_the_stage_is_refused_in_one_line_before_ray(tmp_path, tiny_space, capsys):
    grid = tiny_space(name="grid", finalists={"top": 1, "seeds": 2})  # the tiny space is a grid
    line = refused("search", ["--space", str(grid), "--storage", "{tmp}/r", "--no-plasticity"], tmp_path, capsys)
    assert "the finalists stage needs algorithm: optuna" in line and "--finalists-top 0" in line
    space = tiny_space(name="tpe", **OPTUNA)
    for flag, value in (("--finalists-top", "-1"), ("--finalists-seeds", "-2")):
        line = refused("search", ["--space", str(space), flag, value, "--storage", "{tmp}/r"], tmp_path, capsys)
        assert line == f"error: {flag} must be an integer >= 0 (0 turns the stage off), got {value}"


def test_the_finalists_seeds_are_none_the_search_trained_on(tmp_path, tiny_space):
    plan = prepare(options(tmp_path, tiny_space(finalists={"top": 1, "seeds": 3}, **OPTUNA), seed=4))
    assert plan.settings.seed == 4 and finalist_seeds(plan.spec, plan.settings.seed) == [5, 6, 7]
    seeded = tiny_space(
        name="seeded", finalists={"top": 1, "seeds": 2}, **{**OPTUNA, "parameters": {"seed": {"choice": [0, 42]}}}
    )
    plan = prepare(options(tmp_path, seeded, name="seeded"))
    assert finalist_seeds(plan.spec, plan.settings.seed) == [43, 44]


def test_a_resume_keeps_the_stage_it_started_with_and_refuses_another(tmp_path, tiny_space):
    from vitplast_tune.plan import resume

    space = tiny_space(finalists={"top": 2, "seeds": 3}, **OPTUNA)
    plan = prepare(options(tmp_path, space, name="r", finalists_top=1))
    record = plan.record("parent")
    again = resume.resumed_plan(
        plan.spec, options(tmp_path, space, resume=True), plan.running, plan.storage, "r", record
    )
    assert again.spec.finalists == Finalists(1, 3)
    older = {k: v for k, v in record.items() if k != "finalists"}  # recorded before the stage existed: none
    assert (
        resume.resumed_plan(plan.spec, options(tmp_path, space), plan.running, plan.storage, "r", older).spec.finalists
        == OFF
    )
    with pytest.raises(UserError, match="finalists_top=2 differs from the 1 search"):
        resume.resumed_plan(
            plan.spec, options(tmp_path, space, finalists_top=2), plan.running, plan.storage, "r", record
        )


def test_the_dry_run_counts_and_estimates_the_finalists(tmp_path, tiny_space):
    space = tiny_space(finalists={"top": 2, "seeds": 3}, defaults={"max_steps": 400, "eval_every": 100}, **OPTUNA)
    plan = prepare(options(tmp_path, space))
    (line,) = [line for line in describe_trials(plan) if line.startswith("finalists:")]
    assert "the 2 best configuration(s), full finetuning and the linear probe, each on 3 seed(s)" in line
    assert "up to 12 more trials" in line and "(seeds 1, 2, 3)" in line
    fast = Timing("mha", "fp32", setup_s=2.0, step_s=0.1, val_eval_s=1.0, test_eval_s=1.0, steps_timed=5)
    slow = replace(fast, components="all", step_s=0.2)
    fewest, most = wall_range(plan, [fast, slow], at_once=2)
    alone = replace(plan, spec=replace(plan.spec, finalists=OFF))
    fewest_alone, most_alone = wall_range(alone, [fast, slow], at_once=2)
    assert most - most_alone == pytest.approx(6 * (2 + 400 * 0.2 + 4 * 1.0 + 1))  # 12 trials, 6 waves of 2, slow
    assert fewest - fewest_alone == pytest.approx(12 * (2 + 400 * 0.1 + 4 * 1.0 + 1) / 2)
    assert not any(line.startswith("finalists:") for line in describe_trials(alone))


def test_the_baselines_reference_trials_are_planned_recorded_resumed_estimated_or_turned_off_and_said(
    tmp_path, tiny_space
):
    from vitplast_tune.plan import resume

    subsets = {"components": {"subsets": "any"}, "lr": {"loguniform": [0.01, 0.1]}}
    space = tiny_space(
        **{**OPTUNA, "num_samples": 8, "parameters": subsets, "scheduler": "fifo"},
        baselines={"rates": 2},
        defaults={"max_steps": 400, "eval_every": 100},
    )
    plan = prepare(options(tmp_path, space, name="a"))
    assert plan.spec.baselines == 2 and plan.spec.total_trials == 8 + 4 and plan.record("run")["baselines"] == 2
    (line,) = [line for line in describe_trials(plan) if line.startswith("baselines:")]
    assert line == "baselines:  4 of them, full finetuning and the linear probe at lr 0.0178, 0.0562, never stopped"
    fast = Timing("mha", "fp32", setup_s=2.0, step_s=0.1, val_eval_s=1.0, test_eval_s=1.0, steps_timed=5)
    fewest, most = wall_range(plan, [fast], at_once=2)
    fewest_alone, most_alone = wall_range(replace(plan, spec=replace(plan.spec, baselines=0)), [fast], at_once=2)
    assert most - most_alone == pytest.approx(2 * (2 + 400 * 0.1 + 4 * 1.0 + 1))  # 4 whole trials, 2 waves of 2
    assert fewest - fewest_alone == pytest.approx(4 * (2 + 400 * 0.1 + 4 * 1.0 + 1) / 2)
    record = plan.record("parent")
    again = resume.resumed_plan(plan.spec, options(tmp_path, space), plan.running, plan.storage, "a", record)
    assert again.spec.baselines == 2
    older = {k: v for k, v in record.items() if k != "baselines"}  # recorded before the reference trials: none
    assert (
        resume.resumed_plan(plan.spec, options(tmp_path, space), plan.running, plan.storage, "a", older).spec.baselines
        == 0
    )
    few = prepare(options(tmp_path, space, name="few", num_samples=7))
    assert few.spec.baselines == 0 and few.spec.total_trials == 7
    assert any("no baselines' reference trials (7 trial(s) are fewer than twice their 4" in n for n in few.notes)
