"""The replay benchmark over the lab's kept records (benchmarks.search_replay): tables read from the kept folders,
replays that draw seeds and charge recorded time, the real samplers and ASHA, the cache, and --check (no timing)."""

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from benchmarks import common, replay_tables, search_replay
from benchmarks.replay_tables import Run, Table
from tests._spaces import TINY_SPACE

KEPT = replay_tables.DATA / "lab-v2" / "checks" / "lab.s0.digits_c-contrast"


def _table(curves: dict, seconds: dict, tests: dict) -> Table:
    """A table of (subset, lr) -> [(seed, curve)], each config's seconds per step and test accuracy per seed."""
    runs = {
        key: [Run(seed, tuple(curve), tests[key][seed], seconds[key]) for seed, curve in per_seed.items()]
        for key, per_seed in curves.items()
    }
    return Table("synthetic", replay_tables.DATA, runs, final_only=False)


def test_a_kept_check_becomes_a_table_of_seeds_curves_and_recorded_time():
    table = replay_tables.load_table(KEPT)
    trials = pd.read_csv(KEPT / "trials.csv")
    assert len(table.runs) == trials.groupby(["subset", "lr"]).ngroups == 26
    assert all(len(runs) == 5 for runs in table.runs.values())  # every seed of every configuration
    row = trials.iloc[0]
    run = next(r for r in table.runs[(row["subset"], row["lr"])] if r.seed == row["seed"])
    assert run.seconds_per_step == pytest.approx(row["time_in_steps_s"] / row["steps"])
    assert [s for s, _ in run.curve] == [50, 100, 150]
    means = trials.groupby(["subset", "lr"])["test_acc"].mean()
    assert table.best == (means.idxmax(), pytest.approx(means.max()))  # judged by the mean over seeds
    # discover() lists the check, or the whole lab of its task once that lab is kept (the rule: the test below)
    assert KEPT.name in [folder.name for folder in replay_tables.discover()]


def test_a_diverged_trial_costs_its_steps_and_counts_zero_even_before_its_first_evaluation(tmp_path):
    # curves.csv keeps finite evaluations only; a diverged trial reports no timings (time_in_steps_s empty).
    trials = pd.DataFrame(
        [
            dict(
                trial_id="t0", subset="fc1", lr=1.0, seed=0, steps=150, status="ok", test_acc=0.9, time_in_steps_s=15.0
            ),
            dict(trial_id="t1", subset="fc1", lr=1.0, seed=1, steps=30, status="diverged", seconds=6.0),
            dict(trial_id="t2", subset="fc1", lr=1.0, seed=2, steps=120, status="diverged", seconds=40.0),
        ]
    )
    curves = pd.DataFrame(
        [dict(trial_id="t0", step=s, seconds=s / 5, val_acc=0.8) for s in (50, 100, 150)]
        + [dict(trial_id="t2", step=s, seconds=s / 4, val_acc=0.5) for s in (50, 100)]
    )
    trials.to_csv(tmp_path / "trials.csv", index=False)
    curves.to_csv(tmp_path / "curves.csv", index=False)
    table = replay_tables.load_table(tmp_path)
    runs = {r.seed: r for r in table.runs[("fc1", 1.0)]}
    assert sorted(runs) == [0, 1, 2] and runs[1].diverged and runs[2].diverged
    assert [s for s, _ in runs[1].curve] == [30] and [s for s, _ in runs[2].curve] == [50, 100, 120]
    assert math.isnan(runs[2].curve[-1][1])  # what Tune saw at the diverged step: NaN metrics
    assert runs[1].seconds == pytest.approx(6.0) and runs[2].seconds == pytest.approx(120 * 25 / 100)
    assert table.mean_test(("fc1", 1.0)) == pytest.approx(0.9 / 3)  # the diverged seeds count 0
    assert table.grid_seconds == pytest.approx((15.0 + 6.0 + 30.0) / 3)
    for seed in range(6):  # the one configuration, each search seed drawing one of its seeds
        drawn = runs[search_replay.random.Random(f"{seed}:seeds").choice([0, 1, 2])]
        [(spent, test)] = search_replay.replay(table, "grid order + ASHA", seed, 0.005, 1.0, 10, 1)["path"]
        assert spent == pytest.approx(drawn.seconds / table.grid_seconds, abs=1e-5)
        assert test == (0.0 if drawn.diverged else pytest.approx(0.3))  # a diverged trial is never the answer


def test_a_finished_lab_replaces_its_check(tmp_path):
    for folder in ("lab-v2/checks/lab.s0.a", "lab-v2/checks/lab.s0.b", "lab-v2/lab.s0.b"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "trials.csv").write_text("trial_id\n")
    names = [p.relative_to(tmp_path).as_posix() for p in replay_tables.discover(tmp_path)]
    assert names == ["lab-v2/checks/lab.s0.a", "lab-v2/lab.s0.b"]


def test_grid_order_charges_recorded_seconds_and_judges_the_mean_test_accuracy():
    # b is the better configuration on average (test 0.95) but its seed 1 is unlucky on validation.
    curves = {
        ("a", 0.1): {0: [(10, 0.80)], 1: [(10, 0.80)]},
        ("b", 0.1): {0: [(10, 0.90)], 1: [(10, 0.70)]},
    }
    seconds = {("a", 0.1): 1.0, ("b", 0.1): 3.0}  # b trains more components: three times a's time per step
    tests = {("a", 0.1): {0: 0.90, 1: 0.90}, ("b", 0.1): {0: 0.95, 1: 0.95}}
    table = _table(curves, seconds, tests)
    assert table.grid_seconds == 40 and table.best == (("b", 0.1), 0.95)
    reached = {}
    for seed in range(20):
        out = search_replay.replay(table, "grid order + none", seed, 0.005, 1.0, 10, 1)
        draws = search_replay.random.Random(f"{seed}:seeds")
        draws.choice([0, 1])
        b_seed = draws.choice([0, 1])
        reached[b_seed] = out["reached_s"]
        assert out["path"][0] == (0.25, 0.90)  # a first: 10 steps x 1 s of the grid's 40 s
    assert reached == {0: 1.0, 1: None}  # only b's lucky seed makes b the incumbent: seed noise is replayed


def test_asha_stops_trials_at_its_rung_and_tpe_learns_from_the_replay():
    seconds, curves, tests = {}, {}, {}
    for i, subset in enumerate(["ln1", "mha", "ln2", "fc1", "fc2", "head"]):
        for lr in (0.1, 1.0):
            acc = 0.5 + 0.08 * i + (0.02 if lr == 0.1 else 0)
            curves[(subset, lr)] = {s: [(50, acc - 0.1), (100, acc - 0.05), (150, acc)] for s in (0, 1)}
            seconds[(subset, lr)], tests[(subset, lr)] = 0.1, {0: acc, 1: acc}
    table = _table(curves, seconds, tests)
    asha = search_replay.replay(table, "TPE + ASHA", 0, 0.005, 5.0, 60, 1)
    none = search_replay.replay(table, "TPE + none", 0, 0.005, 5.0, 60, 1)
    assert asha["reached_s"] is not None and none["reached_s"] is not None
    ends = [spent for spent, _ in asha["path"]]
    steps = [round((b - a) * table.grid_seconds / 0.1) for a, b in zip([0.0, *ends], ends)]
    assert 50 in steps and 150 in steps  # stopped at the rung (grace period 50), others trained to the end
    assert set(steps) <= {50, 150}


def test_replays_are_cached_per_table_algorithm_and_seed(tmp_path):
    table = replay_tables.load_table(replay_tables.DATA / "lab-v2" / "checks" / "lab.s0.digits")
    args = search_replay.parse_args(["--cache", str(tmp_path), "--seeds", "2"])
    first, cached = search_replay.cached_replay(tmp_path, table, "random + ASHA", 1, args)
    again, cached_again = search_replay.cached_replay(tmp_path, table, "random + ASHA", 1, args)
    assert (cached, cached_again) == (False, True)
    assert json.loads(json.dumps(first)) == again
    assert len(list(tmp_path.rglob("1.json"))) == 1


def test_the_benchmark_figures_pair_every_algorithm_with_the_default(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["--tables", str(KEPT), "--seeds", "3", "--samplers", "TPE,random", "--schedulers", "ASHA,none"]
    assert (
        search_replay.main([*argv, "--cache", str(tmp_path), "--json", str(out), "--plot", str(tmp_path / "p.png")])
        == 0
    )
    said = capsys.readouterr().out
    assert "[4/4] lab.s0.digits_c-contrast random + none: 3 seeds (0 cached)" in said
    figures = json.loads(out.read_text())
    rows = figures["rows"]
    assert set(rows) == {"TPE + ASHA", "TPE + none", "random + ASHA", "random + none"}
    replays = search_replay.run_all(
        [replay_tables.load_table(KEPT)], ["TPE + ASHA"], search_replay.parse_args([*argv, "--cache", str(tmp_path)])
    )[KEPT.name]["TPE + ASHA"]
    n = search_replay._today().num_samples  # the default space's trials (30)
    spent = [r["path"][n - 1][0] if len(r["path"]) >= n else math.inf for r in replays]  # the n-th trial's end
    assert figures["default_budget"] == {"trials": n, "spent": list(search_replay.quantiles(spent))}
    assert f"the default space's {n} trials (TPE + ASHA) end at" in said
    assert rows["TPE + ASHA"]["paired"]["cheaper"] == 0 == rows["TPE + ASHA"]["paired"]["dearer"]
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert search_replay.main([*argv, "--cache", str(tmp_path)]) == 0
    assert "3 seeds (3 cached)" in capsys.readouterr().out  # resumed from the cache
    with pytest.raises(SystemExit) as refused:  # when its flags are parsed (tests/test_bench_flags.py)
        search_replay.main(["--samplers", "CMA"])
    assert refused.value.code == 2 and 'unknown "CMA"' in capsys.readouterr().err
    (tmp_path / "nowhere").mkdir()  # a folder without a kept table (one that is not there: refused when parsed)
    assert search_replay.main(["--tables", str(tmp_path / "nowhere")]) == 2  # one line, no traceback
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --tables: {tmp_path / 'nowhere'}: no trials.csv nor analysis/lab_trials.csv"
    ]
    with pytest.raises(SystemExit, match="2"):  # would replay nothing and report "not reached"
        search_replay.main([*argv, "--workers", "0"])


def test_the_figures_from_the_cache_take_each_algorithm_as_far_as_every_table_has_it(tmp_path, capsys):
    """--from-cache replays nothing: each algorithm with the seeds 0, 1, ... cached on every table (the model-based
    samplers given fewer seeds than the rest), one left out with a line where a table has none; one with fewer
    seeds than the default is never the winner."""
    out, cache = tmp_path / "r.json", ["--cache", str(tmp_path)]
    tables = ["--tables", str(KEPT)]
    assert search_replay.main([*tables, *cache, "--seeds", "3", "--samplers", "TPE", "--schedulers", "ASHA"]) == 0
    assert search_replay.main([*tables, *cache, "--seeds", "2", "--samplers", "random", "--schedulers", "ASHA"]) == 0
    capsys.readouterr()
    argv = [*tables, *cache, "--from-cache", "--seeds", "50", "--samplers", "TPE,random,GP", "--schedulers", "ASHA"]
    assert search_replay.main([*argv, "--json", str(out)]) == 0
    said = capsys.readouterr().out
    assert "TPE + ASHA: 3 seeds on each of 1 tables, from the cache" in said
    assert "random + ASHA: 2 seeds on each of 1 tables, from the cache" in said
    assert "GP + ASHA: not in the cache on every table, left out" in said
    assert "search seeds: TPE + ASHA 3, random + ASHA 2" in said and "[1/" not in said  # nothing replayed
    rows = json.loads(out.read_text())["rows"]
    assert {name: row["seeds"] for name, row in rows.items()} == {"TPE + ASHA": 3, "random + ASHA": 2}
    assert len(list(tmp_path.rglob("*.json"))) == 5 + 1  # the five replays and the figures: no replay added
    assert search_replay.main([*argv[:-4], "--samplers", "GP", "--schedulers", "ASHA"]) == 2  # nothing cached
    assert capsys.readouterr().err.strip().endswith("no algorithm is cached on every table; replay them first")
    rows["TPE + ASHA"]["seconds"] = (0.5, 0.1, 0.9)  # the default reaching, at a median of half the grid
    rows["TPE + ASHA"]["per_table"] = {t: (0.5, 0.1, 0.9) for t in rows["TPE + ASHA"]["per_table"]}
    rows["random + ASHA"]["seconds"] = (0.0, 0.0, 0.0)  # cheapest, but on fewer seeds than the default
    rows["random + ASHA"]["per_table"] = {t: (0.0, 0.0, 0.0) for t in rows["random + ASHA"]["per_table"]}
    table = SimpleNamespace(name=next(iter(rows["TPE + ASHA"]["per_table"])))
    assert search_replay.verdict([table], rows).startswith("winner by the rule: TPE + ASHA")
    rows["random + ASHA"]["seeds"] = 3
    assert search_replay.verdict([table], rows).startswith("winner by the rule: random + ASHA")


def test_quantiles_count_a_replay_that_never_reached_as_infinite():
    assert search_replay.quantiles([0.1, 0.2, math.inf]) == (0.2, 0.1, math.inf)


@pytest.fixture
def tiny_table(tmp_path):
    """A kept folder trained here: one configuration of the tiny testbed space, two seeds; each trial's config holds
    the space's constant parameters, as Tune gives them (here max_steps: 24, not the defaults' 16)."""
    from vitplast_tune.config import trial_config
    from vitplast_tune.plan import prepare
    from vitplast_tune.vit.training import finetune

    space = tmp_path / "tiny.yaml"
    parameters = {**TINY_SPACE["parameters"], "seed": {"choice": [0, 1]}, "max_steps": 24}
    space.write_text(yaml.safe_dump({**TINY_SPACE, "parameters": parameters}))
    constants = {k: v for k, v in parameters.items() if not isinstance(v, dict)}
    folder = tmp_path / "lab.s0.tiny"
    folder.mkdir()
    lab = {"space": str(space), "model": "vit_testbed_patch8_32", "dataset": "digits"}
    (folder / "lab.json").write_text(json.dumps(lab))
    settings = prepare(
        common.search_options(space, tmp_path, settings={k: lab[k] for k in ("model", "dataset")})
    ).settings
    trials, curves = [], []
    for seed in (0, 1):
        reports = []
        config = trial_config({**constants, "components": "fc1", "lr": 0.3, "seed": seed}, settings)
        finetune(config, report=lambda m, *_, out=reports: out.append(m))
        last = reports[-1]
        trials.append(
            dict(
                trial_id=f"t{seed}",
                subset="fc1",
                lr=0.3,
                seed=seed,
                steps=last["step"],
                status="ok",
                test_acc=last.get("test_acc", math.nan),
                time_in_steps_s=last["time_in_steps_s"],
            )
        )
        curves += [
            dict(trial_id=f"t{seed}", step=m["step"], seconds=m["time_in_steps_s"], val_acc=m["val_acc"])
            for m in reports
        ]
    pd.DataFrame(trials).to_csv(folder / "trials.csv", index=False)
    pd.DataFrame(curves).to_csv(folder / "curves.csv", index=False)
    return folder


def test_check_trains_a_configuration_again_and_compares_it_with_the_seeds(tiny_table):
    [(line, agrees)] = search_replay.check([replay_tables.load_table(tiny_table)], 1)
    assert agrees and "fc1 lr=0.3" in line and "within seed noise" in line
    assert [s for s, _ in replay_tables.load_table(tiny_table).runs[("fc1", 0.3)][0].curve] == [8, 16, 24]
    curves = pd.read_csv(tiny_table / "curves.csv")
    curves[curves["step"] < 24].to_csv(tiny_table / "curves.csv", index=False)  # a table of shorter trainings
    [(line, agrees)] = search_replay.check([replay_tables.load_table(tiny_table)], 1)
    assert not agrees and "evaluated at steps [8, 16, 24], the table at [8, 16]" in line
    curves["val_acc"] -= 0.3  # a table that does not replay this training
    curves.to_csv(tiny_table / "curves.csv", index=False)
    [(line, agrees)] = search_replay.check([replay_tables.load_table(tiny_table)], 1)
    assert not agrees and "OUTSIDE seed noise" in line


def test_a_replay_is_the_same_for_the_same_seed_hyperband_included():
    table = replay_tables.load_table(replay_tables.DATA / "lab-v2" / "checks" / "lab.s0.fractals_novel_c-speckle_noise")
    first = search_replay.replay(table, "random + HyperBand", 0, 0.005, 1.0, 200, 1)
    assert search_replay.replay(table, "random + HyperBand", 0, 0.005, 1.0, 200, 1) == first  # brackets drawn alike


def _replayed(costs):
    """Replay results with these costs (fractions of the grid's seconds; inf: never reached)."""
    return [
        {"reached_s": None if math.isinf(c) else c, "reached_steps": None if math.isinf(c) else 1, "path": [(c, 0.9)]}
        for c in costs
    ]


def test_the_paired_comparison_is_a_sign_test_of_the_cost_that_counts_replays_never_reaching():
    table = SimpleNamespace(name="t", best=(("fc1", 0.1), 0.9))
    default = [0.10, 0.10, 0.10, 0.10, 0.10, 0.10, 0.10, 0.10, 0.10, math.inf, math.inf, 0.10]
    other = [0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.20, 0.05, math.inf, 0.10]
    results = {"t": {"TPE + ASHA": _replayed(default), "random + ASHA": _replayed(other)}}
    summary = search_replay.summarise([table], results, ["TPE + ASHA", "random + ASHA"])
    paired = summary["rows"]["random + ASHA"]
    assert summary["default_budget"]["spent"] == (math.inf, math.inf, math.inf)  # one trial each: never the n-th
    n = search_replay._today().num_samples
    for i, replay in enumerate(results["t"]["TPE + ASHA"]):  # the default's n-th trial ends at i / 100
        replay["path"] = [(0.001 * k, 0.9) for k in range(n - 1)] + [(i / 100, 0.9)] + [(1.0, 0.9)]
    spent = search_replay.summarise([table], results, ["TPE + ASHA", "random + ASHA"])["default_budget"]["spent"]
    assert spent == (0.05, 0.02, 0.08)  # of 0.00 ... 0.11: median and quartiles by nearest rank
    # cheaper in 9 pairs (one where the default never reached), dearer in 1; the two ties are left out
    assert (paired["paired"]["cheaper"], paired["paired"]["dearer"]) == (9 / 12, 1 / 12)
    assert paired["paired"]["sign_p"] == pytest.approx(22 / 1024)  # P(X <= 1 or X >= 9), X ~ Binomial(10, 1/2)


def test_the_winner_rule_with_a_default_that_often_does_not_reach():
    tables = [SimpleNamespace(name="a"), SimpleNamespace(name="b")]

    def rows(b_default, b_other):
        return {
            "TPE + ASHA": {
                "seeds": 50,
                "seconds": (0.10, 0, 0),
                "reached": 1.0,
                "per_table": {"a": (0.1, 0.05, 0.2), "b": b_default},
            },
            "GP + ASHA": {
                "seeds": 50,
                "seconds": (0.04, 0, 0),
                "reached": 1.0,
                "per_table": {"a": (0.05, 0.03, 0.1), "b": b_other},
            },
        }

    # b: the default's IQR is unbounded (it did not reach in over a quarter of its searches)
    assert "winner by the rule: GP + ASHA" in search_replay.verdict(tables, rows((0.3, 0.1, math.inf), (0.6, 0.3, 1)))
    assert "winner by the rule: TPE + ASHA" in search_replay.verdict(
        tables, rows((0.3, 0.1, math.inf), (math.inf, 0.5, math.inf))
    )  # the other mostly never reaches b, which the default mostly solves
    assert "winner by the rule: TPE + ASHA" in search_replay.verdict(tables, rows((0.3, 0.2, 0.4), (0.6, 0.3, 1)))


def test_one_replay_answers_every_tolerance_and_the_floor_is_the_whole_grid_judged_by_one_seed():
    # b is the best on average (0.95); its seed 1 is unlucky on validation, and a's seed 1 lucky.
    curves = {
        ("a", 0.1): {0: [(10, 0.80)], 1: [(10, 0.92)]},
        ("b", 0.1): {0: [(10, 0.90)], 1: [(10, 0.70)]},
    }
    tests = {("a", 0.1): {0: 0.90, 1: 0.90}, ("b", 0.1): {0: 0.95, 1: 0.95}}
    table = _table(curves, {("a", 0.1): 1.0, ("b", 0.1): 1.0}, tests)
    path = {"path": [(0.5, 0.90), (1.0, 0.95)]}
    assert search_replay.cost_within(path, 0.95, 0.005) == 1.0
    assert search_replay.cost_within(path, 0.95, 0.05) == 0.5  # within 5 points from the first trial on
    assert search_replay.cost_within(path, 0.96, 0.005) == math.inf
    regrets = search_replay.floor(table, 40)
    for seed, regret in enumerate(regrets):  # a draw picks b only where b's drawn seed beats a's on validation
        draws = search_replay.random.Random(f"{seed}:floor")
        a_seed, b_seed = draws.choice([0, 1]), draws.choice([0, 1])
        b_wins = (0.90 if b_seed == 0 else 0.70) > (0.80 if a_seed == 0 else 0.92)
        assert regret == pytest.approx(0.0 if b_wins else 5.0)
    assert 0 < regrets.count(0.0) < 40


def test_the_answers_at_each_budget_are_paired_with_the_default_and_said_after_holm():
    def result(test_at):  # a replay whose incumbent's mean test accuracy is test_at(spent) at each 0.05
        return {"path": [(round(0.05 * i, 2), test_at(0.05 * i)) for i in range(1, 21)]}

    tables = [SimpleNamespace(name="t", best=(("b", 0.1), 0.95))]
    jitter = [0.001 * (i % 7) for i in range(30)]
    results = {
        "t": {
            "TPE + ASHA": [result(lambda f, j=j: 0.90 + j) for j in jitter],
            "random + ASHA": [result(lambda f, j=j: 0.91 + j + (0.001 * (j > 0.003))) for j in jitter],
            "TPE + none": [result(lambda f, j=j: 0.90 + j) for j in jitter],
        }
    }
    compared = search_replay.answers(tables, results, ["TPE + ASHA", "random + ASHA", "TPE + none"])
    assert set(compared) == set(search_replay.ANSWER_AT)
    closer, same = compared[0.25]["random + ASHA"], compared[0.25]["TPE + none"]
    assert closer["difference"] == pytest.approx(-1.0 - 0.1 * sum(j > 0.003 for j in jitter) / 30)
    assert closer["holm_p"] < 0.05 and (same["difference"], same["p"]) == (0.0, 1.0)
    said = search_replay.answers_said(compared)
    assert said[1].startswith("stopped at 0.25 of the grid's GPU-seconds")
    assert "closer to the best than the default's: random + ASHA (-1.04)" in said[1] and "TPE + none" not in said[1]
    results["t"]["random + ASHA"] = results["t"]["TPE + ASHA"]
    assert search_replay.answers_said(search_replay.answers(tables, results, ["TPE + ASHA", "random + ASHA"]))[0] == (
        "stopped at 0.1 of the grid's GPU-seconds, answers (points, paired, Holm p < 0.05) "
        "no algorithm's differs from the default's"
    )


def test_the_rule_decides_nothing_where_no_median_reached_and_names_only_what_a_space_file_can():
    tables = [SimpleNamespace(name="a")]
    never = {
        "seeds": 50,
        "seconds": (math.inf, 0.2, math.inf),
        "reached": 0.3,
        "per_table": {"a": (math.inf, 0.2, math.inf)},
    }
    grid = {**never, "seconds": (0.4, 0.05, math.inf), "per_table": {"a": (0.4, 0.05, math.inf)}}
    rows = {"TPE + ASHA": never, "random + none": {**never, "reached": 0.5}, "grid order + none": grid}
    said = search_replay.verdict(tables, rows)
    assert said.startswith("winner by the rule: grid order + none, median 0.400")
    assert said.endswith("no median reached the target, so the rule decides nothing and the default stays")
    rows["GP + none"] = {**never, "reached": 0.6}  # first by its share reached, but its median not reached either
    del rows["grid order + none"]
    assert (
        search_replay.verdict(tables, rows)
        == "no median reached the target: the rule decides nothing and the default stays"
    )
    rows["random + none"] = {**grid, "reached": 0.5}
    assert search_replay.verdict(tables, rows).startswith("winner by the rule: random + none, median 0.400")
