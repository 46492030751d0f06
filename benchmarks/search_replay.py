"""GPU-seconds to the answer, replayed over the criteria lab's kept records (a tabular benchmark, as NAS-Bench-201 and
HPOBench are): samplers x schedulers, each searching every table with many search seeds.

Each table is one kept folder (``benchmarks/replay_tables.py``): subset x lr x seed -> curve and recorded time. A
replayed search is driven exactly as Tune drives the real one: the search's ``OptunaSearcher`` over the real Optuna
sampler (TPE as today, TPE multivariate + group, GPSampler, random) or the lab's grid order, and Ray's own ASHA
(today's grace period and reduction factor, ``search_spaces/component_subsets.yaml``), asynchronous HyperBand (Ray's
ASHAScheduler with every bracket) or no early stopping, deciding at each evaluation from the recorded val_acc. Every
trial it starts draws one of the table's seeds (seed noise included) and each step costs that run's recorded seconds.
The space is the table's, not ``component_subsets.yaml``'s: the subset is one categorical choice (the table holds the
probe, full finetuning and subsets of five components, not of the six a search's flags name) and the rate an index
into the subset's recorded rates (a continuous rate has no recorded curve between them); so "TPE as today" is
today's sampler on this encoding.

The figure: GPU-seconds (and steps) until the incumbent, the configuration of the best validation accuracy among the
trials ended so far, has a TEST accuracy (mean over the table's seeds) within --tolerance (0.5 points) of the table's
best configuration's, as a fraction of the grid's cost (every configuration once). Median and IQR over tables x
search seeds, a paired comparison of each algorithm against today's default (TPE + ASHA, same tables and seeds), and a
plot of the incumbent's distance to the best against the fraction of the grid's cost. The goal of issue 47: the
default at <= 0.05 of the grid's GPU-seconds (median). Each replay is cached (per table, algorithm and search seed, in
``$VITPLAST_CACHE_DIR/search_replay``), so a run interrupted resumes and new tables (the whole labs, when they land in
``docs/results/data/lab-v2/``) add only their own replays; ``--from-cache`` gives the figures of what is cached, each
algorithm with as many seeds as every table has. Each replay runs its whole budget, so its path also gives the cost
to other tolerances (1 and 2 points), the answer when stopped at fixed budgets (paired with the default's: Wilcoxon,
Holm), and the whole grid once (every configuration on a drawn seed, judged by validation) is the reference line.
``--check N`` trains N configurations again and compares their curves with the table's seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import heapq
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from ray.tune.schedulers import TrialScheduler

from benchmarks import common
from benchmarks.replay_tables import Key, Run, Table, discover, load_table

SAMPLERS = ("TPE", "TPE multivariate+group", "GP", "random", "grid order")
# Each Optuna sampler's name in the search's registry (space.samplers); "grid order" is the lab's order, no sampler.
REGISTERED = {"TPE": "tpe", "TPE multivariate+group": "tpe-multivariate", "GP": "gp", "random": "random"}
SCHEDULERS = ("ASHA", "HyperBand", "none")
DEFAULT = "TPE + ASHA"  # the search's default today (component_subsets.yaml)
VERSION = 1  # of the replay's rules: a change makes every cached replay stale


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument(
        "--tables",
        nargs="*",
        type=common.folder,
        help="kept folders to replay (default: every lab and check of lab-v2)",
    )
    p.add_argument(
        "--seeds", type=common.at_least(1), default=50, help="search seeds per table and algorithm (default: 50)"
    )
    p.add_argument(
        "--samplers",
        type=common.listed(common.known(SAMPLERS)),
        default=",".join(SAMPLERS),
        help=f"comma-separated (default: {','.join(SAMPLERS)})",
    )
    p.add_argument(
        "--schedulers",
        type=common.listed(common.known(SCHEDULERS)),
        default=",".join(SCHEDULERS),
        help=f"comma-separated (default: {','.join(SCHEDULERS)})",
    )
    p.add_argument(
        "--tolerance",
        type=common.at_least(0, float),
        default=0.005,
        help="below the best mean test accuracy (default: 0.005)",
    )
    p.add_argument(
        "--budget", type=common.above(0), default=1.0, help="a replay stops at this fraction of the grid's cost"
    )
    p.add_argument(
        "--max-trials", type=common.at_least(1), default=200, help="and after this many trials (default: 200)"
    )
    p.add_argument("--workers", type=common.at_least(1), default=1, help="trials running at once (default: 1)")
    p.add_argument("--cache", type=common.output_dir, help="cache folder (default: $VITPLAST_CACHE_DIR/search_replay)")
    p.add_argument(
        "--from-cache",
        action="store_true",
        help="replay nothing: the figures of the replays cached so far (seeds 0, 1, ... up to --seeds; each algorithm "
        "as many as it has on every table), e.g. when the model-based samplers got fewer seeds than the rest",
    )
    p.add_argument("--plot", type=common.output, help="write the plot (PNG) here")
    p.add_argument(
        "--check", type=common.at_least(0), default=0, metavar="N", help="train N configurations again and compare"
    )
    common.add_json_flag(p)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- the algorithms


def _space(table: Table) -> Callable:
    """The table's configurations as Optuna's define-by-run space: the subset, then its own rate (an ordinal index
    over the subset's recorded rates, ascending: the grid's rates are evenly spaced in log)."""

    def space(trial) -> None:
        subset = trial.suggest_categorical("subset", table.subsets)
        trial.suggest_int(f"lr_{subset}", 0, len(table.rates(subset)) - 1)

    return space


def config_key(table: Table, config: dict[str, Any]) -> Key:
    """The (subset, lr) a suggested configuration names."""
    subset = config["subset"]
    return subset, table.rates(subset)[int(config[f"lr_{subset}"])]


def sampler(name: str, seed: int):
    """The real Optuna sampler of ``name``, seeded: the search's own (``vitplast_tune.space.samplers``)."""
    import optuna

    from vitplast_tune.space.samplers import make_sampler

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return make_sampler(REGISTERED[name], seed)


def scheduler(name: str, max_steps: int):
    """Ray's scheduler of ``name``: today's ASHA (the search's own), asynchronous HyperBand or none."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from vitplast_tune.run import schedulers

    today = _today()
    if name == "ASHA":
        made = schedulers.scheduler(today, max_steps)
    elif name == "HyperBand":  # every bracket of the asynchronous HyperBand (Li et al. 2020)
        rungs = int(math.log(max_steps / today.scheduler.grace_period, today.scheduler.reduction_factor)) + 1
        made = ASHAScheduler(
            time_attr="step",
            max_t=max_steps,
            grace_period=today.scheduler.grace_period,
            reduction_factor=today.scheduler.reduction_factor,
            brackets=max(rungs, 1),
        )
    else:
        made = FIFOScheduler()
    made.set_search_properties("val_acc", "max")  # as TuneConfig(metric, mode) does
    return made


@functools.cache
def _today():
    """The search's default space (component_subsets.yaml): its ASHA is today's."""
    from vitplast_tune.space import load_space

    return load_space("component_subsets")


class GridOrder:
    """The lab's grid order (the order its trials ran), each configuration once, as a searcher."""

    def __init__(self, table: Table):
        rates = {s: table.rates(s) for s in table.subsets}
        self.configs = iter([{"subset": s, f"lr_{s}": i} for s in table.subsets for i in range(len(rates[s]))])

    def suggest(self, trial_id: str) -> dict | None:
        return next(self.configs, None)

    def on_trial_result(self, trial_id, result) -> None:
        pass

    def on_trial_complete(self, trial_id, result=None, error=False) -> None:
        pass


def searcher(name: str, table: Table, seed: int):
    """The searcher of a sampler: the search's own OptunaSearcher over the table's space, or the grid's order."""
    if name == "grid order":
        return GridOrder(table)
    import optuna

    from vitplast_tune.run import OptunaSearcher

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return OptunaSearcher(space=_space(table), metric="val_acc", mode="max", sampler=sampler(name, seed))


# ----------------------------------------------------------------------------- one replay


@dataclasses.dataclass
class _Progress:
    """A replay's running totals: GPU-seconds and steps spent, trials started, the incumbent and the figures."""

    table: Table
    target: float
    spent_s: float = 0.0
    spent_steps: float = 0.0
    launched: int = 0
    incumbent: tuple[float, Key] | None = None
    out: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"reached_s": None, "reached_steps": None, "trials": None, "path": []}
    )

    def charge(self, run: Run, i: int) -> None:
        """Charge the steps from the run's previous evaluation to its ``i``-th, at its recorded seconds."""
        steps = run.curve[i][0] - (run.curve[i - 1][0] if i else 0)
        self.spent_s += steps * run.seconds_per_step
        self.spent_steps += steps

    def ended(self, key: Key, run: Run, i: int, diverged: bool) -> None:
        """A trial ended after its ``i``-th evaluation: the incumbent, the path, the trial (``ended``: its subset, rate,
        best validation accuracy or None where it diverged, seed and seconds) and the figures once it reaches."""
        best_val = max(a for _, a in run.curve[: i + 1])
        cost = run.curve[i][0] * run.seconds_per_step
        self.out.setdefault("ended", []).append([*key, None if diverged else best_val, run.seed, round(cost, 4)])
        if not diverged and (self.incumbent is None or best_val > self.incumbent[0]):
            self.incumbent = (best_val, key)
        test = self.table.mean_test(self.incumbent[1]) if self.incumbent else 0.0
        grid_s = self.table.grid_seconds
        self.out["path"].append((round(self.spent_s / grid_s, 5), round(test, 5)))
        if self.out["reached_s"] is None and test >= self.target:
            reached = {"reached_s": self.spent_s / grid_s, "reached_steps": self.spent_steps / self.table.grid_steps}
            self.out.update(reached, trials=self.launched)


def replay(
    table: Table, algorithm: str, seed: int, tolerance: float, budget: float, max_trials: int, workers: int, refs=()
):
    """One replayed search of ``table``.

    Args:
        table: the table.
        algorithm: "<sampler> + <scheduler>".
        seed: the search seed (the sampler's, and that of the seed each trial draws).
        tolerance: the reach, below the table's best mean test accuracy.
        budget: the replay starts no trial once it spent this fraction of the grid's seconds.
        max_trials: nor after this many trials.
        workers: trials running at once.
        refs: configurations trained first, as the search's reference trials (``_next_key``).

    Returns:
        ``reached_s``, ``reached_steps`` (fractions of the grid's, None when not reached), ``trials`` started by then,
        ``path`` (fraction of the grid's seconds, incumbent's mean test accuracy) and ``ended`` (``_Progress.ended``).
    """
    np.random.seed(seed)  # Ray's HyperBand draws each trial's bracket from numpy's global generator
    sampler_name, scheduler_name = algorithm.split(" + ")
    search = _OwnTrials(searcher(sampler_name, table, seed))
    sched = scheduler("none" if table.final_only else scheduler_name, table.max_steps)
    draws = random.Random(f"{seed}:seeds")  # the same draws for every algorithm at this seed: paired
    progress = _Progress(table, table.best[1] - tolerance)
    events: list = []
    order = itertools.count()

    def launch(now: float) -> None:
        if progress.launched >= max_trials or progress.spent_s >= budget * table.grid_seconds:
            return
        trial = SimpleNamespace(trial_id=f"replay_{progress.launched:05d}", config={})
        if (key := _next_key(trial, search, table, progress.launched, refs)) is None:
            return
        progress.launched += 1
        run = draws.choice(table.runs[key])
        sched.on_trial_add(None, trial)
        heapq.heappush(events, (now + run.curve[0][0] * run.seconds_per_step, next(order), trial, key, run, 0))

    for _ in range(workers):
        launch(0.0)
    while events:
        now, _, trial, key, run, i = heapq.heappop(events)
        progress.charge(run, i)
        step, acc = run.curve[i]
        last = i == len(run.curve) - 1
        result = {"step": step, "val_acc": acc, "max_steps": table.max_steps, "diverged": run.diverged and last}
        result.update(training_iteration=i + 1, trial_id=trial.trial_id)
        decision = sched.on_trial_result(None, trial, result)
        if decision != TrialScheduler.STOP:
            search.on_trial_result(trial.trial_id, result)
        if decision == TrialScheduler.STOP or last:
            sched.on_trial_complete(None, trial, result)
            search.on_trial_complete(trial.trial_id, result=result, error=result["diverged"])
            progress.ended(key, run, i, result["diverged"])
            launch(now)
        else:
            following = (run.curve[i + 1][0] - step) * run.seconds_per_step
            heapq.heappush(events, (now + following, next(order), trial, key, run, i + 1))
    return progress.out


REFERENCE_PREFIX = "reference_"  # a reference trial's id in a replay


class _OwnTrials:
    """A sampler's searcher told of its own trials alone: never of a reference trial (``_next_key``)."""

    def __init__(self, search):
        self.search = search

    def suggest(self, trial_id: str) -> dict | None:
        return self.search.suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if not trial_id.startswith(REFERENCE_PREFIX):
            self.search.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if not trial_id.startswith(REFERENCE_PREFIX):
            self.search.on_trial_complete(trial_id, result=result, error=error)


def _next_key(trial: SimpleNamespace, search, table: Table, launched: int, references: tuple[Key, ...]) -> Key | None:
    """The configuration the next trial trains: the next reference trial's, marked in the trial's config as the
    search marks its baselines' (``vitplast_tune.space.baselines``: the scheduler never stops one, the sampler never
    hears of one); then the sampler's suggestion (None: it has none)."""
    from vitplast_tune.config import REFERENCE_KEY

    if launched < len(references):
        trial.trial_id = f"{REFERENCE_PREFIX}{launched:05d}"
        trial.config = {REFERENCE_KEY: {"index": launched + 1, "of": len(references)}}
        return references[launched]
    config = search.suggest(trial.trial_id)
    return None if config is None else config_key(table, config)


# ----------------------------------------------------------------------------- all replays, cached


def cache_folder(args: argparse.Namespace) -> Path:
    from vitplast_tune.config import cache_dir

    return Path(args.cache) if args.cache else cache_dir() / "search_replay"


def _cache_path(folder: Path, table: Table, algorithm: str, seed: int, args: argparse.Namespace) -> Path:
    """Where one replay is cached: per table (and its digest), the replay's rules, algorithm and search seed."""
    rules = f"v{VERSION}-tol{args.tolerance:g}-b{args.budget:g}-t{args.max_trials}-w{args.workers}"
    return folder / f"{table.name}-{table.digest}" / rules / algorithm.replace(" ", "_") / f"{seed}.json"


def cached_replay(folder: Path, table: Table, algorithm: str, seed: int, args: argparse.Namespace) -> tuple[dict, bool]:
    """One replay, read from the cache when done before with the same table and rules; (result, was it cached)."""
    path = _cache_path(folder, table, algorithm, seed, args)
    if path.is_file():
        return json.loads(path.read_text()), True
    result = replay(table, algorithm, seed, args.tolerance, args.budget, args.max_trials, args.workers)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(result))
    os.replace(partial, path)
    return result, False


def run_all(tables: list[Table], algorithms: list[str], args: argparse.Namespace) -> dict[str, dict[str, list[dict]]]:
    """Every table x algorithm x search seed (the grid's order too: its trials draw their seeds), a progress line per
    table and algorithm."""
    folder = cache_folder(args)
    if args.from_cache:
        return cached_so_far(folder, tables, algorithms, args)
    results: dict[str, dict[str, list[dict]]] = {}
    total, done = len(tables) * len(algorithms), 0
    for table in tables:
        for algorithm in algorithms:
            started = said_at = time.time()
            runs = []
            for seed in range(args.seeds):
                runs.append(cached_replay(folder, table, algorithm, seed, args))
                if time.time() - said_at > 30 and seed + 1 < args.seeds:  # a slow sampler (GP) still shows progress
                    print(f"[{done + 1}/{total}] {table.name} {algorithm}: seed {seed + 1}/{args.seeds}", flush=True)
                    said_at = time.time()
            results.setdefault(table.name, {})[algorithm] = [r for r, _ in runs]
            done += 1
            fresh = sum(not was for _, was in runs)
            reached = sorted(_cost(r) for r, _ in runs if not math.isinf(_cost(r)))
            said = f"median {statistics.median(reached):.3f} of the grid's seconds among them" if reached else ""
            print(
                f"[{done}/{total}] {table.name} {algorithm}: {len(runs)} seeds ({len(runs) - fresh} cached), "
                f"{len(reached)} reached the target {said}, {time.time() - started:.1f} s",
                flush=True,
            )
    return results


def cached_so_far(
    folder: Path, tables: list[Table], algorithms: list[str], args: argparse.Namespace
) -> dict[str, dict[str, list[dict]]]:
    """The cached replays of each algorithm on every table, seeds 0, 1, ... as far as every table has them (at most
    ``--seeds``), so that a paired comparison pairs the same seeds; an algorithm with none on some table is left out,
    with a line saying so."""
    results: dict[str, dict[str, list[dict]]] = {t.name: {} for t in tables}
    for algorithm in algorithms:
        per_table = {}
        for table in tables:
            runs = []
            for seed in range(args.seeds):
                path = _cache_path(folder, table, algorithm, seed, args)
                if not path.is_file():
                    break
                runs.append(json.loads(path.read_text()))
            per_table[table.name] = runs
        n = min(len(runs) for runs in per_table.values())
        if n == 0:
            print(f"{algorithm}: not in the cache on every table, left out", flush=True)
            continue
        for name, runs in per_table.items():
            results[name][algorithm] = runs[:n]
        print(f"{algorithm}: {n} seeds on each of {len(tables)} tables, from the cache", flush=True)
    return results


def _cost(result: dict) -> float:
    """A replay's figure: the fraction of the grid's seconds to reach the target (inf when not reached)."""
    return math.inf if result["reached_s"] is None else result["reached_s"]


# ----------------------------------------------------------------------------- the figures

CHECKPOINTS = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0)  # fractions of the grid's seconds at which the regret is read
TOLERANCES = (0.005, 0.01, 0.02)  # reaches read again from the same replays' paths (each replay runs its budget)
ANSWER_AT = (0.1, 0.25, 0.5, 1.0)  # budgets at which each answer is compared with the default's, paired
OFFERED = {"TPE + ASHA", "TPE + none", "random + ASHA", "random + none"}  # what a space file can name (optuna/random,
# asha/fifo): the default can only become one of these


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """Median and IQR by nearest rank (a replay that never reached counts as infinite, so no interpolation)."""
    import numpy as np

    q = np.percentile(np.asarray(values, dtype=float), [25, 50, 75], method="inverted_cdf")
    return float(q[1]), float(q[0]), float(q[2])


def regret_at(result: dict, fraction: float, best: float) -> float:
    """The incumbent's distance to the table's best mean test accuracy, in points, once ``fraction`` of the grid's
    seconds is spent (infinite before any trial ended)."""
    ended = [test for spent, test in result["path"] if spent <= fraction + 1e-9]
    return 100 * (best - ended[-1]) if ended else math.inf


def cost_within(result: dict, best: float, tolerance: float) -> float:
    """The fraction of the grid's seconds at which the replay's incumbent first came within ``tolerance`` of ``best``
    (inf when never): read from its path, so that one replay answers for every tolerance."""
    return next((spent for spent, test in result["path"] if test >= best - tolerance - 1e-9), math.inf)


def floor(table: Table, seeds: int) -> list[float]:
    """What the whole grid gives, each configuration trained once on a drawn seed and the one of the best validation
    accuracy taken (as a replay's incumbent is): its distance to the table's best mean test accuracy, in points, per
    draw; the reference for a search's answer at the grid's cost (a search that trains a configuration twice gets a
    second draw of its seed, so it can end closer)."""
    best = table.best[1]
    regrets = []
    for seed in range(seeds):
        draws = random.Random(f"{seed}:floor")
        chosen = [(key, draws.choice(runs)) for key, runs in table.runs.items()]
        _, key = max((max(a for _, a in run.curve), key) for key, run in chosen if not run.diverged)
        regrets.append(100 * (best - table.mean_test(key)))
    return regrets


def summarise(tables: list[Table], results: dict, algorithms: list[str]) -> dict[str, Any]:
    """Per algorithm over every table and seed, per table, and paired against the default."""
    from scipy.stats import binomtest

    best = {t.name: t.best[1] for t in tables}
    rows: dict[str, Any] = {}
    for algorithm in algorithms:
        pooled = [r for t in tables for r in results[t.name][algorithm]]
        costs = [_cost(r) for r in pooled]
        steps = [math.inf if r["reached_steps"] is None else r["reached_steps"] for r in pooled]
        regrets = {
            f: [regret_at(r, f, best[t.name]) for t in tables for r in results[t.name][algorithm]] for f in CHECKPOINTS
        }
        rows[algorithm] = {
            "seeds": len(results[tables[0].name][algorithm]),
            "reached": sum(not math.isinf(c) for c in costs) / len(costs),
            "seconds": quantiles(costs),
            "steps": quantiles(steps),
            "regret": {f: quantiles(v)[0] for f, v in regrets.items()},
            "per_table": {t.name: quantiles([_cost(r) for r in results[t.name][algorithm]]) for t in tables},
            "by_tolerance": {
                tol: _reach([cost_within(r, best[t.name], tol) for t in tables for r in results[t.name][algorithm]])
                for tol in TOLERANCES
            },
        }
    if DEFAULT in rows:
        for algorithm in algorithms:
            pairs = [
                (_cost(a), _cost(d), regret_at(a, 0.05, best[t.name]), regret_at(d, 0.05, best[t.name]))
                for t in tables
                for a, d in zip(results[t.name][algorithm], results[t.name][DEFAULT])
            ]
            differences = [a - d for _, _, a, d in pairs if math.isfinite(a) and math.isfinite(d)]
            cheaper, dearer = sum(a < d for a, d, _, _ in pairs), sum(a > d for a, d, _, _ in pairs)
            rows[algorithm]["paired"] = {
                "cheaper": cheaper / len(pairs),
                "dearer": dearer / len(pairs),
                "regret_difference_at_0.05": statistics.median(differences) if differences else math.nan,
                # A sign test of the cost itself (a replay that never reached is dearer than one that did; equal
                # costs, both never reaching among them, are left out): the figure the verdict reads.
                "sign_p": binomtest(cheaper, cheaper + dearer).pvalue if cheaper + dearer else math.nan,
            }
    compared = answers(tables, results, algorithms) if DEFAULT in rows else {}
    summary = {"rows": rows, "answers": compared, "verdict": verdict(tables, rows)}
    if DEFAULT in rows:
        n = _today().num_samples
        ends = [
            r["path"][n - 1][0] if len(r["path"]) >= n else math.inf for t in tables for r in results[t.name][DEFAULT]
        ]
        summary["default_budget"] = {"trials": n, "spent": quantiles(ends)}
    return summary


def grid_floor(tables: list[Table], seeds: int) -> dict[str, Any]:
    """The floor over every table (``floor``): median [IQR] points below the best, and the share within each
    tolerance."""
    regrets = [r for t in tables for r in floor(t, seeds)]
    return {
        "regret": quantiles(regrets),
        "within": {tol: sum(r <= 100 * tol + 1e-7 for r in regrets) / len(regrets) for tol in TOLERANCES},
    }


def answers(tables: list[Table], results: dict, algorithms: list[str]) -> dict[float, dict[str, dict[str, float]]]:
    """The answer a search gives when it stops at each budget of ``ANSWER_AT``, against the default's, paired by table
    and search seed: the mean difference of the points below the best (negative: closer to it), Wilcoxon's
    signed-rank p and Holm's adjustment over the algorithms at that budget."""
    from scipy.stats import wilcoxon

    from vitplast_tune.analysis.multiple import holm

    best = {t.name: t.best[1] for t in tables}
    out: dict[float, dict[str, dict[str, float]]] = {}
    others = [a for a in algorithms if a != DEFAULT]
    for budget in ANSWER_AT:
        figures = {}
        for algorithm in others:
            pairs = [
                (regret_at(a, budget, best[t.name]), regret_at(d, budget, best[t.name]))
                for t in tables
                for a, d in zip(results[t.name][algorithm], results[t.name][DEFAULT])
            ]
            differences = [a - d for a, d in pairs if math.isfinite(a) and math.isfinite(d)]
            moved = [d for d in differences if abs(d) > 1e-9]
            p = float(wilcoxon(moved).pvalue) if len(moved) >= 6 else 1.0  # no test on fewer moved pairs
            figures[algorithm] = {"difference": float(np.mean(differences)) if differences else math.nan, "p": p}
        adjusted = holm([f["p"] for f in figures.values()]) if figures else []
        for f, q in zip(figures.values(), adjusted):
            f["holm_p"] = float(q)
        out[budget] = figures
    return out


def answers_said(compared: dict[float, dict[str, dict[str, float]]], alpha: float = 0.05) -> list[str]:
    """One line per budget, generated from the figures: which answers are closer to or further from the best than
    the default's after Holm's adjustment, or that none differs."""
    lines = []
    for budget, figures in compared.items():
        better = [
            f"{a} ({f['difference']:+.2f})" for a, f in figures.items() if f["holm_p"] < alpha and f["difference"] < 0
        ]
        worse = [
            f"{a} ({f['difference']:+.2f})" for a, f in figures.items() if f["holm_p"] < alpha and f["difference"] > 0
        ]
        said = []
        if better:
            said.append(f"closer to the best than the default's: {', '.join(better)}")
        if worse:
            said.append(f"further from the best than the default's: {', '.join(worse)}")
        lines.append(
            f"stopped at {budget:g} of the grid's GPU-seconds, answers (points, paired, Holm p < {alpha:g}) "
            + ("; ".join(said) if said else "no algorithm's differs from the default's")
        )
    return lines


def _reach(costs: list[float]) -> dict[str, Any]:
    """The share of replays that reached and the median cost [IQR]."""
    return {"reached": sum(math.isfinite(c) for c in costs) / len(costs), "seconds": quantiles(costs)}


def verdict(tables: list[Table], rows: dict[str, Any]) -> str:
    """Issue 47's rule: the winner has the lowest median cost over every table and seed without losing on any table by
    more than the default's IQR there, over as many search seeds as the default; the default changes only when the
    winner is another algorithm.

    Where the default's IQR is unbounded (it did not reach in a quarter of its searches or more), a median loses
    only when it is infinite and the default's is not: a table the default mostly solves, the other mostly not.
    """
    if DEFAULT not in rows:
        return "the default was not replayed"

    def loses(median: float, d_median: float, d_q1: float, d_q3: float) -> bool:
        if math.isfinite(d_q3 - d_q1):
            return median > d_median + (d_q3 - d_q1)
        return math.isinf(median) and math.isfinite(d_median)

    def fair(algorithm: str) -> bool:
        if rows[algorithm]["seeds"] < rows[DEFAULT]["seeds"]:  # fewer search seeds (--from-cache): not a winner
            return False
        return not any(
            loses(rows[algorithm]["per_table"][t.name][0], *rows[DEFAULT]["per_table"][t.name]) for t in tables
        )

    ranked = sorted(rows, key=lambda a: (rows[a]["seconds"][0], -rows[a]["reached"]))
    winner = next((a for a in ranked if a == DEFAULT or fair(a)), DEFAULT)
    if math.isinf(rows[winner]["seconds"][0]):  # every median "not reached": the order among them is no ranking
        return "no median reached the target: the rule decides nothing and the default stays"
    said = f"winner by the rule: {winner}, median {_median_said(rows[winner])} of the grid's GPU-seconds (goal <= 0.05)"
    if winner not in OFFERED:
        offered = next((a for a in ranked if a in OFFERED and (a == DEFAULT or fair(a))), DEFAULT)
        said += "; a space file cannot name it (it names optuna or random with asha or fifo); among what it can name: "
        if math.isinf(rows[offered]["seconds"][0]):
            return said + "no median reached the target, so the rule decides nothing and the default stays"
        said += f"{offered}, median {_median_said(rows[offered])}"
    return said


def _median_said(row: dict[str, Any]) -> str:
    cost = row["seconds"][0]
    return f"{cost:.3f}" if math.isfinite(cost) else "not reached"


def print_summary(summary: dict[str, Any], tables: list[Table], args: argparse.Namespace) -> None:
    """The table of the algorithms, the paired comparison and the verdict."""
    kinds = sorted({"whole lab" if "checks" not in str(t.path) else "check" for t in tables})
    print(
        f"\n{len(tables)} tables ({', '.join(kinds)}), {_seeds_said(summary['rows'])}, {args.workers} trial(s) at once, "
        f"replays stop at {args.budget:g} of the grid's GPU-seconds; reach = incumbent's mean test accuracy within "
        f"{100 * args.tolerance:g} points of the table's best"
    )
    f = lambda v: f"{v:.3f}" if math.isfinite(v) else "  inf"
    print(
        f"{'algorithm':<34} {'reached':>7} {'GPU-s median [IQR]':>24} {'steps median':>12} "
        f"{'regret@0.05':>11} {'@0.25':>6} {'@1':>6} {'cheaper/dearer than default':>28} {'sign p':>7}"
    )
    for name, row in summary["rows"].items():
        m, q1, q3 = row["seconds"]
        regret = row["regret"]
        paired = row.get("paired", {})
        pair = f"{paired['cheaper']:.2f}/{paired['dearer']:.2f}" if paired else ""
        print(
            f"{name:<34} {row['reached']:7.2f} {f(m):>7} [{f(q1)}, {f(q3)}] {f(row['steps'][0]):>12} "
            f"{regret[0.05]:11.2f} {regret[0.25]:6.2f} {regret[1.0]:6.2f} {pair:>28} {paired.get('sign_p', math.nan):7.3f}"
        )
    print(f"\n{'reach within':<34} " + " ".join(f"{f'{100 * tol:g} points':>30}" for tol in TOLERANCES))
    for name, row in summary["rows"].items():
        cells = []
        for tol in TOLERANCES:
            reach = row["by_tolerance"][tol]
            m, q1, q3 = reach["seconds"]
            cells.append(f"{reach['reached']:.2f} {f(m)} [{f(q1)}, {f(q3)}]")
        print(f"{name:<34} " + " ".join(f"{c:>30}" for c in cells))
    m, q1, q3 = summary["floor"]["regret"]
    within = ", ".join(f"{100 * tol:g} points {share:.2f}" for tol, share in summary["floor"]["within"].items())
    print(
        f"the whole grid once, on drawn seeds, judged by validation: {m:.2f} [{q1:.2f}, {q3:.2f}] points "
        f"below the best (median [IQR]); within {within} of its draws"
    )
    if "default_budget" in summary:
        budget = summary["default_budget"]
        m, q1, q3 = budget["spent"]
        print(
            f"the default space's {budget['trials']} trials ({DEFAULT}) end at {f(m)} [{f(q1)}, {f(q3)}] of the grid's "
            "GPU-seconds (median [IQR]): the budget a default search spends"
        )
    for line in answers_said(summary["answers"]):
        print(line)
    print(summary["verdict"])


def _seeds_said(rows: dict[str, Any]) -> str:
    """``50 search seeds each``, or how many each algorithm has where they differ (``--from-cache``)."""
    counts = {row["seeds"] for row in rows.values()}
    if len(counts) == 1:
        return f"{counts.pop()} search seeds each"
    return "search seeds: " + ", ".join(f"{name} {row['seeds']}" for name, row in rows.items())


def plot(tables: list[Table], results: dict, algorithms: list[str], path: str, whole_grid: float | None = None) -> None:
    """The incumbent's median distance to the best (points) against the fraction of the grid's GPU-seconds spent;
    ``whole_grid``: the whole grid's median (``grid_floor``), drawn as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    best = {t.name: t.best[1] for t in tables}
    xs = np.geomspace(0.005, max(CHECKPOINTS), 60)
    colours = dict(zip(SAMPLERS, plt.get_cmap("tab10").colors))
    styles = dict(zip(SCHEDULERS, ("-", "--", ":")))
    fig, ax = plt.subplots(figsize=(8, 5))
    for algorithm in algorithms:
        sampler_name, scheduler_name = algorithm.split(" + ")
        runs = [(r, best[t.name]) for t in tables for r in results[t.name][algorithm]]
        ys = [quantiles([regret_at(r, x, b) for r, b in runs])[0] for x in xs]
        ax.plot(
            xs,
            ys,
            styles[scheduler_name],
            color=colours[sampler_name],
            label=algorithm,
            lw=2 if algorithm == DEFAULT else 1,
        )
    ax.axvline(0.05, color="grey", lw=0.8)
    ax.axhline(0.5, color="grey", lw=0.8)
    if whole_grid is not None:
        ax.axhline(whole_grid, color="black", lw=0.8, ls="-.", label="the whole grid once (median)")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylim(bottom=0)
    ax.set(
        xscale="log",
        xlabel="fraction of the grid's GPU-seconds spent",
        ylabel="incumbent's median points below the best (mean test acc.)",
        title=f"Search replay over {len(tables)} kept tables",
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- the check


def check(tables: list[Table], count: int, seed: int = 0) -> list[tuple[str, bool]]:
    """Train ``count`` configurations again (drawn across the tables, each with one of its seeds) and compare each
    evaluation's val_acc with the table's seeds there: within 3 seed standard deviations + 1 point of their mean, at
    the steps the table evaluated.

    Returns:
        (line, agrees) per configuration.
    """
    from vitplast_tune.config import trial_config
    from vitplast_tune.vit.training import finetune

    draws = random.Random(seed)
    picks = [(t, k) for t in tables for k in sorted(t.runs)]
    out = []
    for table, (subset, lr) in draws.sample(picks, min(count, len(picks))):
        runs = table.runs[(subset, lr)]
        run_seed = draws.choice(runs).seed
        again: dict[int, float] = {}
        config = {"components": subset, "lr": lr, "seed": run_seed}
        finetune(
            trial_config(config, lab_settings(table)),
            report=lambda m, *_, out=again: out.update({m["step"]: m["val_acc"]}),
        )
        recorded = sorted({s for r in runs for s, a in r.curve if math.isfinite(a)})
        far = [] if sorted(again) == recorded else [f"evaluated at steps {sorted(again)}, the table at {recorded}"]
        for step, acc in sorted(again.items()):
            seen = [a for r in runs for s, a in r.curve if s == step and math.isfinite(a)]
            if not seen:
                continue
            mean = statistics.mean(seen)
            sd = statistics.stdev(seen) if len(seen) > 1 else 0.0
            if abs(acc - mean) > 3 * sd + 0.01:
                far.append(f"step {step}: {acc:.4f} vs {mean:.4f} +- {sd:.4f}")
        agrees = bool(again) and not far
        said = "within seed noise" if agrees else f"OUTSIDE seed noise ({'; '.join(far) or 'no evaluation'})"
        out.append((f"{table.name} {subset} lr={lr:g} seed={run_seed}: {said}", agrees))
    return out


def lab_settings(table: Table):
    """The FinetuneConfig every trial of the table's lab trained with: its space's defaults, model and dataset, and
    the space's constant parameters (each trial's config holds them, as Tune's param_space gives them)."""
    from vitplast_tune.config import trial_config
    from vitplast_tune.plan import prepare
    from vitplast_tune.space.distributions import Constant

    with common.scratch("replay_check_") as tmp:
        options = common.search_options(
            table.lab.get("space", "criteria_lab"),
            tmp,
            settings={"model": table.lab["model"], "dataset": table.lab["dataset"]},
        )
        plan = prepare(options)
    constants = {name: p.value for name, p in plan.spec.parameters.items() if isinstance(p, Constant)}
    return trial_config(constants, plan.settings)


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folders = [Path(p) for p in args.tables] if args.tables else discover()
    samplers = [s.strip() for s in args.samplers.split(",")]  # each known, the counts positive: parse_args
    scheds = [s.strip() for s in args.schedulers.split(",")]
    if not folders:
        print("error: no kept tables found; give them with --tables FOLDER ...", file=sys.stderr)
        return 2
    try:
        tables = [load_table(f) for f in folders]
    except (FileNotFoundError, KeyError, ValueError) as exc:  # a folder without records, or records without columns
        print(f"error: --tables: {exc}", file=sys.stderr)
        return 2
    algorithms = [f"{a} + {s}" for a in samplers for s in scheds]
    if args.check:
        lines = check(tables, args.check)
        for line, _ in lines:
            print(f"check, trained again: {line}", flush=True)
        if not all(ok for _, ok in lines):
            return 1
    results = run_all(tables, algorithms, args)
    algorithms = [a for a in algorithms if a in results[tables[0].name]]  # --from-cache leaves out the uncached
    if not algorithms:
        print("error: --from-cache: no algorithm is cached on every table; replay them first", file=sys.stderr)
        return 2
    summary = summarise(tables, results, algorithms)
    summary["floor"] = grid_floor(tables, max(row["seeds"] for row in summary["rows"].values()))
    print_summary(summary, tables, args)
    if args.plot:
        plot(tables, results, algorithms, args.plot, summary["floor"]["regret"][0])
        print(f"plot written to {args.plot}")
    common.write_json(args.json, {"args": vars(args), "tables": [t.name for t in tables], **summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
