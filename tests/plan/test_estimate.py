"""The dry run's arithmetic: trials' steps under each scheduler, the wall-time range, concurrency, the timed configs."""

from dataclasses import replace

import pytest

from vitplast_tune.errors import UserError
from vitplast_tune.plan import SearchOptions, prepare
from vitplast_tune.plan.estimate import (
    Timing,
    concurrency,
    describe_trials,
    minutes,
    step_budget,
    timed_configs,
    wall_range,
)
from vitplast_tune.space import load_space
from vitplast_tune.space.files import SchedulerSpec


def options(tmp_path, space, **kw):
    return SearchOptions(space=str(space), storage=str(tmp_path / "results"), plasticity=False, **kw)


def spec_with(tiny_space, **top):
    return load_space(tiny_space(**top))


def test_asha_stops_all_but_a_reduction_factor_share_at_each_rung(tiny_space):
    asha = {"name": "asha", "grace_period": 100, "reduction_factor": 3}
    spec = spec_with(tiny_space, algorithm="random", num_samples=9, scheduler=asha)
    # 9 trials: 6 stop at 100, 2 at 300, 1 trains 400 steps.
    assert step_budget(spec, 400, 50) == (pytest.approx(6 * 100 + 2 * 300 + 400), 9 * 400)
    # Reports every 60 steps: a trial stops at the first report past a rung (120 and 300), never past max_steps.
    assert step_budget(spec, 400, 60)[0] == pytest.approx(6 * 120 + 2 * 300 + 400)
    median = replace(spec, scheduler=replace(spec.scheduler, name="median"))
    assert step_budget(median, 400, 50) == (pytest.approx(4.5 * 100 + 4.5 * 400), 9 * 400)
    fifo = replace(spec, scheduler=SchedulerSpec())
    assert step_budget(fifo, 400, 50) == (9 * 400, 9 * 400)


def test_wall_time_range_in_waves_and_with_early_stopping(tmp_path, tiny_space):
    space = tiny_space(
        algorithm="random",
        num_samples=9,
        scheduler={"name": "asha", "grace_period": 100, "reduction_factor": 3},
        defaults={"max_steps": 400, "eval_every": 100},
    )
    prepared = prepare(options(tmp_path, space))
    fast = Timing("mha", "fp32", setup_s=2.0, step_s=0.1, val_eval_s=1.0, test_eval_s=1.0, steps_timed=5)
    slow = replace(fast, components="all", step_s=0.2)
    fewest, most = wall_range(prepared, [fast, slow], at_once=2)
    assert most == pytest.approx(5 * (2 + 400 * 0.2 + 4 * 1.0 + 1))  # 5 waves of 2 trials at the slower step
    steps = 6 * 100 + 2 * 300 + 400
    assert fewest == pytest.approx((steps * (0.1 + 1.0 / 100) + 9 * (2 + 1)) / 2)
    assert fewest < most


def test_concurrency_is_what_nodes_hold_at_most_max_concurrent(tmp_path, tiny_space):
    space = tiny_space(algorithm="random", num_samples=20)
    at = "127.0.0.1:6399"  # a cluster: a local search asking for a GPU this machine lacks is refused in prepare
    prepared = prepare(options(tmp_path, space, cpus_per_trial=2, gpus_per_trial=0.5, address=at))
    nodes = [{"CPU": 16.0, "GPU": 2.0}, {"CPU": 4.0, "GPU": 1.0}]
    assert concurrency(prepared, nodes, "the cluster") == 4 + 2
    assert concurrency(replace(prepared, max_concurrent=3), nodes, "the cluster") == 3
    with pytest.raises(UserError, match=r"a trial asks for \{CPU: 2, GPU: 0.5\}, more than this machine has"):
        concurrency(prepared, [{"CPU": 2.0, "GPU": 0.0}], "this machine")


def test_timed_configs_are_the_default_trial_and_the_largest_subset(tmp_path, tiny_space):
    chosen = tiny_space(parameters={"components": {"choice": ["mha", "ln1+fc1+fc2", "head"]}})
    configs = timed_configs(prepare(options(tmp_path, chosen, name="a")))
    assert [c.components for c in configs] == ["mha", "ln1+fc1+fc2"]
    assert configs[0].lr == configs[1].lr == 0.05 and configs[0].max_steps == 16
    anything = tiny_space(parameters={"components": {"subsets": "any"}})
    assert [c.components for c in timed_configs(prepare(options(tmp_path, anything, name="b")))] == ["all"]


def test_the_plan_in_words(tmp_path, tiny_space):
    space = tiny_space(
        algorithm="optuna",
        num_samples=30,
        parameters={"components": {"subsets": "any_or_head"}, "lr": {"loguniform": [0.001, 1.0]}},
    )
    lines = "\n".join(describe_trials(prepare(options(tmp_path, space))))
    assert "trials:     36, optuna (seed 0), no early stopping; metric val_acc (max)" in lines  # 30 and 6 baselines
    assert "baselines:  6 of them, full finetuning and the linear probe at lr 0.00316, 0.0316, 0.316" in lines
    assert "components: any subset or the linear probe of emb, ln1, mha, ln2, fc1, fc2 (64)" in lines
    assert "lr: log-uniform [0.001, 1]" in lines and "optimizer: sgd (fixed)" in lines
    grid = tiny_space(parameters={"lr": {"choice": [0.01, 0.1]}, "seed": {"choice": list(range(10))}})
    lines = "\n".join(describe_trials(prepare(options(tmp_path, grid, name="grid"))))
    assert (
        "grid:       20 configurations x 1 repeat(s):" in lines
        and "components=mha lr=0.01 optimizer=sgd seed=0" in lines
    )
    assert "... and 8 more" in lines
    assert "16 steps at batch 32, evaluated every 8" in lines
    budgets = tiny_space(budgets=[8, {"steps": 24, "lr": [0.05]}])
    lines = "\n".join(describe_trials(prepare(options(tmp_path, budgets, name="budgets"))))
    assert "8 or 24 steps at batch 32" in lines  # each budget's steps, not the default max_steps no trial trains


def test_durations_under_ten_minutes_keep_their_tenths():
    # "2 min to 3 min" hid a lower bound of 95 s below a search whose trials took 97 s.
    shown = [minutes(s) for s in (88, 95, 170, 1500, 7200)]
    assert shown == ["88 s", "1.6 min", "2.8 min", "25 min", "2.0 h"]
