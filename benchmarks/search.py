"""Search efficiency on the offline testbed: training steps that grid, random search and TPE + ASHA
need to reach the accuracy of the full grid's best configuration (within --tolerance, 0.5 points),
as a fraction of the grid's steps, averaged over search seeds (goal for TPE + ASHA: <= 0.2).

1. The real grid: every configuration of a discrete space (default vitplast_tune/search_spaces/single_component.yaml:
   8 subsets x 5 learning rates = 40 trials of 400 steps) runs once through ``vitplast_tune.run_search``
   on a Ray instance started here (--cpus CPUs, one per trial), and every trial's learning curve
   (val_acc at each evaluation) is recorded to --curves. Its best best_val_acc is the reference.
   The training seed is pinned (seed: 0 in the space's defaults) so that it does not follow the
   search seed.
2. A REPLAY of the other searches over those recorded curves (training is deterministic: a
   configuration's curve is the same in every search, which --check re-verifies by training one
   configuration again). The algorithms are the real ones, driven exactly as Tune drives them:
   Ray's BasicVariantGenerator for grid order and random sampling, the search's OptunaSearcher with
   Optuna's TPESampler(seed) over the same discrete space, and the search's ASHAScheduler (grace
   period and reduction factor of vitplast_tune/search_spaces/component_subsets.yaml unless given) deciding at
   each rung from the recorded val_acc. --workers trials run at once (every step costs the same
   time in the replay). Steps are counted over finished trials, in order of completion, up to and
   including the first one whose best val_acc reaches best_grid - tolerance.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import yaml
from ray.tune import Callback

from benchmarks import common
from vitplast_tune import storage
from vitplast_tune.plan import prepare
from vitplast_tune.records.table import trial_subset
from vitplast_tune.run import OptunaSearcher, schedulers
from vitplast_tune.run.driver import run as run_search
from vitplast_tune.run.optuna_search import warm_start_points
from vitplast_tune.run.variants import tune_param_space
from vitplast_tune.space import OptunaSpace, SearchSpec, load_space

Key = tuple[str, float]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__)
    _grid_flags(p)
    _replay_flags(p)
    common.add_json_flag(p)
    return p.parse_args(argv)


def _grid_flags(p: argparse.ArgumentParser) -> None:
    """The flags of the space and of the real grid."""
    p.add_argument(
        "--space",
        default="single_component",
        help="discrete space file (choices only) shared by all searches (default: single_component)",
    )
    p.add_argument(
        "--curves",
        type=common.output,
        default=str(storage.default_storage() / "bench_search_curves.json"),
        help="recorded grid curves: read when present, else the grid runs and writes them (default: ~/vitplast_tune_results/bench_search_curves.json)",
    )
    p.add_argument("--rerun-grid", action="store_true", help="run the grid even when --curves exists")
    p.add_argument("--model", help="model for the grid (default: the space file's, the pretrained testbed)")
    p.add_argument(
        "--pretrained",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="load the model's pretrained weights (default: the space file's)",
    )
    p.add_argument("--max-steps", type=common.at_least(1), help="steps per trial (default: the space file's)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=common.setting,
        help="pin a training setting of every configuration, e.g. --set eval_every=10 (YAML; repeatable)",
    )
    p.add_argument(
        "--lrs",
        type=lambda text: [float(v) for v in text.split(",")],
        help="learning-rate grid replacing the space's lr range, e.g. 0.03,0.1,0.3 (component_subsets)",
    )
    p.add_argument(
        "--cpus",
        type=common.at_least(1),
        default=2,
        help="CPUs of the Ray instance for the grid; one per trial (default: 2)",
    )


def _replay_flags(p: argparse.ArgumentParser) -> None:
    """The flags of the replayed searches (and of the check that they replay the grid exactly)."""
    p.add_argument(
        "--seeds",
        type=common.at_least(1),
        default=50,
        help="search seeds averaged over; the replay is cheap (default: 50)",
    )
    p.add_argument(
        "--workers", type=common.at_least(1), default=1, help="trials running at once in the replay (default: 1)"
    )
    p.add_argument(
        "--max-trials",
        type=common.at_least(1),
        default=200,
        help="a replayed search that has not reached the target after this many trials counts as failed (default: 200)",
    )
    p.add_argument(
        "--grace-period", type=common.at_least(1), help="ASHA grace period in steps (default: component_subsets.yaml's)"
    )
    p.add_argument(
        "--reduction-factor", type=common.at_least(2), help="ASHA reduction factor (default: component_subsets.yaml's)"
    )
    p.add_argument(
        "--warm-start",
        type=common.at_least(0),
        default=3,
        metavar="K",
        help="also replay TPE (+ ASHA) with recommend's top K subsets enqueued first (default: 3; 0: none)",
    )
    p.add_argument(
        "--tolerance",
        type=common.at_least(0, float),
        default=0.005,
        help="accuracy below the grid's best that counts as reached (default: 0.005 = 0.5 points)",
    )
    p.add_argument(
        "--check",
        type=common.at_least(0),
        default=1,
        help="configurations trained again in this process to confirm the curves replay exactly (default: 1; 0 skips)",
    )


# ----------------------------------------------------------------------------- spaces


def variant(
    base: SearchSpec,
    directory: Path,
    algorithm: str,
    scheduler: dict | str,
    settings: dict,
    lrs: list[float] | None = None,
) -> SearchSpec:
    """The base space's parameters with another algorithm/scheduler (and pinned settings), as a loaded space file.

    ``lrs`` replaces the space's learning rate (a range in component_subsets.yaml) by a grid of choices.
    """
    raw = yaml.safe_load(base.text)
    raw.update(algorithm=algorithm, scheduler=scheduler, num_samples=1)
    raw.pop("warm_start", None)
    if lrs:
        raw["parameters"]["lr"] = {"choice": lrs}
    raw["defaults"] = {**(raw.get("defaults") or {}), **settings, "seed": 0}
    return load_space(common.write_space(directory / f"{base.name}_{algorithm}.yaml", raw))


def key(config: dict[str, Any]) -> Key:
    return trial_subset(config), float(config["lr"])


# ----------------------------------------------------------------------------- the real grid


class Curves(Callback):
    """Every trial's reported results (step, val_acc, best_val_acc, diverged), in order."""

    def __init__(self):
        self.curves: dict[str, dict[str, Any]] = {}

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        entry = self.curves.setdefault(
            trial.trial_id, {"config": {k: trial.config[k] for k in ("components", "lr")}, "results": []}
        )
        keep = ("step", "val_acc", "best_val_acc", "diverged", "test_acc")
        entry["results"].append({k: result[k] for k in keep if k in result})


def run_grid(spec: SearchSpec, cpus: int, directory: Path) -> tuple[list[dict], float]:
    """Run the grid for real; return each configuration's curve and the wall time."""
    recorder = Curves()
    started = time.time()
    with common.local_ray(cpus):
        run_search(common.search_options(spec.path, directory, name="bench_search_grid"), callbacks=[recorder])
    return list(recorder.curves.values()), time.time() - started


def check_replay(curves: dict[Key, list[dict]], settings: dict, count: int) -> list[str]:
    """Train ``count`` configurations again (the best first) and compare their val_acc curves."""
    from vitplast_tune.config import trial_config
    from vitplast_tune.vit.training import finetune

    order = sorted(curves, key=lambda k: -best_acc(curves[k]))[:count]
    lines = []
    for components, lr in order:
        again: list[float] = []
        finetune(
            trial_config({"components": components, "lr": lr}, settings),
            report=lambda m, s, out=again: out.append(m["val_acc"]),
        )
        recorded = [r["val_acc"] for r in curves[(components, lr)]]
        same = again == recorded
        lines.append(
            f"{components} lr={lr:g}: {'identical curve' if same else f'DIFFERENT curve: {again} vs {recorded}'}"
        )
    return lines


# ----------------------------------------------------------------------------- replay


def best_acc(results: list[dict]) -> float:
    values = [r["val_acc"] for r in results if not math.isnan(r.get("val_acc", math.nan))]
    return max(values, default=-1.0)


def generator_configs(spec: SearchSpec, seed: int, samples: int, directory: Path) -> Callable[[str], dict | None]:
    """Ray's BasicVariantGenerator (grid order, or seeded random sampling) as a suggest function."""
    from ray.tune.search import BasicVariantGenerator

    gen = BasicVariantGenerator(random_state=seed)
    gen.add_configurations(
        {
            "replay": {
                "run": lambda config: None,
                "config": tune_param_space(spec),
                "num_samples": samples,
                "storage_path": str(directory / "ray"),
            }
        }
    )

    def suggest(trial_id: str) -> dict | None:
        trial = gen.next_trial()
        return None if trial is None else trial.config

    return suggest


def replay(
    curves: dict[Key, list[dict]],
    suggest: Callable[[str], dict | None],
    searcher,
    scheduler,
    workers: int,
    target: float,
    max_trials: int,
) -> tuple[int | None, int, int]:
    """Run a search over the recorded curves; return (steps to target or None, finished trials, steps spent)."""
    from ray.tune.schedulers import TrialScheduler

    events: list = []
    order = itertools.count()
    launched = finished = spent = 0

    def launch(now: int) -> None:
        nonlocal launched
        if launched >= max_trials:
            return
        trial = SimpleNamespace(trial_id=f"replay_{launched:05d}")
        config = suggest(trial.trial_id)
        if config is None:
            return
        launched += 1
        curve = curves[key(config)]
        scheduler.on_trial_add(None, trial)
        heapq.heappush(events, (now + curve[0]["step"], next(order), trial, curve, 0, now))

    for _ in range(workers):
        launch(0)
    while events:
        now, _, trial, curve, i, started = heapq.heappop(events)
        result = {**curve[i], "training_iteration": i + 1, "trial_id": trial.trial_id}
        decision = scheduler.on_trial_result(None, trial, result)
        if decision != TrialScheduler.STOP:
            searcher.on_trial_result(trial.trial_id, result)
        if decision == TrialScheduler.STOP or i == len(curve) - 1:
            scheduler.on_trial_complete(None, trial, result)
            searcher.on_trial_complete(trial.trial_id, result=result)
            finished += 1
            spent += result["step"]
            if best_acc(curve[: i + 1]) >= target:
                return spent, finished, spent
            launch(now)
        else:
            heapq.heappush(events, (started + curve[i + 1]["step"], next(order), trial, curve, i + 1, started))
    return None, finished, spent


class NoSearcher:
    """The searcher hooks of a generator-driven (grid / random) search: nothing to learn."""

    def on_trial_result(self, trial_id, result):
        pass

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass


def algorithms(
    specs: dict[str, SearchSpec],
    max_steps: int,
    directory: Path,
    max_trials: int,
    warm_start: list[str] | None = None,
):
    """name -> factory(seed) returning (suggest, searcher, scheduler), built by the search's own code.

    ``warm_start``: the subsets TPE tries first (``warm_start_points``) in the "+ warm start" rows.
    """
    import optuna
    from optuna.samplers import TPESampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def scheduler(spec):
        made = schedulers.scheduler(spec, max_steps)
        made.set_search_properties(spec.metric, spec.mode)  # as TuneConfig(metric, mode) does
        return made

    def tpe(spec, first=()):
        def make(seed):
            points = warm_start_points(dataclasses.replace(spec, warm_start=len(first)), first) or None
            searcher = OptunaSearcher(
                space=OptunaSpace(spec.parameters),
                metric=spec.metric,
                mode=spec.mode,
                sampler=TPESampler(seed=seed),
                points_to_evaluate=points,
            )
            return searcher.suggest, searcher, scheduler(spec)

        return make

    def generated(spec, samples):
        return lambda seed: (generator_configs(spec, seed, samples, directory), NoSearcher(), scheduler(spec))

    return {
        "grid": generated(specs["grid"], 1),
        "random": generated(specs["random"], max_trials),
        "random + ASHA": generated(specs["random_asha"], max_trials),
        "TPE": tpe(specs["optuna"]),
        "TPE + ASHA": tpe(specs["optuna_asha"]),
        **(
            {}
            if not warm_start
            else {
                "TPE + warm start": tpe(specs["optuna"], warm_start),
                "TPE + ASHA + warm": tpe(specs["optuna_asha"], warm_start),
            }
        ),
    }


# ----------------------------------------------------------------------------- main


def asha_scheduler(args: argparse.Namespace) -> dict[str, Any]:
    """The ASHA scheduler of the "+ ASHA" searches: component_subsets.yaml's unless the flags say otherwise."""
    reference = load_space("component_subsets").scheduler
    return {
        "name": "asha",
        "grace_period": args.grace_period or reference.grace_period,
        "reduction_factor": args.reduction_factor or reference.reduction_factor,
    }


def variants(args: argparse.Namespace, asha: dict[str, Any], directory: Path) -> dict[str, SearchSpec]:
    """The --space with each search's algorithm and scheduler, the flags' settings pinned, written to ``directory``."""
    base = load_space(args.space)
    pinned = dict(model=args.model, pretrained=args.pretrained, max_steps=args.max_steps, **dict(args.set))
    pinned = {k: v for k, v in pinned.items() if v is not None}
    specs = {
        "grid": variant(base, directory, "grid", "fifo", pinned, args.lrs),
        "random": variant(base, directory, "random", "fifo", pinned, args.lrs),
        "optuna": variant(base, directory, "optuna", "fifo", pinned, args.lrs),
    }
    specs["random_asha"] = variant(base, directory, "random", asha, pinned, args.lrs)
    specs["optuna_asha"] = variant(base, directory, "optuna", asha, pinned, args.lrs)
    return specs


def grid_curves(args: argparse.Namespace, grid: SearchSpec, settings, directory: Path) -> dict:
    """The recorded grid: read from --curves, or the grid run for real and written there."""
    curves_path = Path(args.curves)
    if curves_path.is_file() and not args.rerun_grid:
        recorded = json.loads(curves_path.read_text())
        print(
            f"grid curves read from {curves_path} (recorded {recorded['date']}, grid wall time {recorded['grid_wall_s'] / 60:.1f} min)"
        )
        return recorded
    print(
        f"running the real grid: {len(grid.grid)} trials of {settings.max_steps} steps, "
        f"{settings.model} (pretrained={settings.pretrained}) on {settings.dataset}, {args.cpus} CPUs ...",
        flush=True,
    )
    before = _weights_provenance(settings)
    trials, wall = run_grid(grid, args.cpus, directory)
    recorded = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "grid_wall_s": wall,
        "settings": settings,
        "weights": _weights_provenance(settings),
        "trials": trials,
    }
    if recorded["weights"] != before:
        print(
            "warning: the testbed checkpoint changed while the grid ran; run it again (--rerun-grid)",
            file=sys.stderr,
        )
    curves_path.parent.mkdir(parents=True, exist_ok=True)
    curves_path.write_text(json.dumps(recorded, indent=1, default=str))
    print(f"grid done in {wall / 60:.1f} min; curves written to {curves_path}")
    return recorded


def usable_curves(recorded: dict, settings, grid: SearchSpec) -> dict[Key, list[dict]] | None:
    """Each grid configuration's recorded curve; None (after saying so) when the record lacks one."""
    if recorded["settings"] != json.loads(json.dumps(settings, default=str)):
        print(
            "warning: the recorded curves were made with other settings than these; pass --rerun-grid",
            file=sys.stderr,
        )
    curves = {key(t["config"]): t["results"] for t in recorded["trials"]}
    missing = [k for k in map(key, grid.grid) if k not in curves]
    if missing:
        print(f"error: the recorded grid lacks {missing}; pass --rerun-grid", file=sys.stderr)
        return None
    return curves


def print_grid(curves: dict[Key, list[dict]], grid: SearchSpec, tolerance: float) -> dict[str, Any]:
    """Print the grid's best, the target and each configuration's best val_acc; return steps, best, target, reaching."""
    grid_steps = sum(r[-1]["step"] for r in curves.values())
    best_key = max(curves, key=lambda k: best_acc(curves[k]))
    best = best_acc(curves[best_key])
    target = best - tolerance
    reaching = sorted(f"{c} lr={lr:g}" for (c, lr), r in curves.items() if best_acc(r) >= target)
    print(
        f"grid: {len(curves)} configurations, {grid_steps} steps; best val_acc {best:.4f} ({best_key[0]} lr={best_key[1]:g}); "
        f"target {target:.4f}, reached by {len(reaching)}: {', '.join(reaching)}"
    )
    names = list(dict.fromkeys(c for c, _ in map(key, grid.grid)))
    lrs = sorted({lr for _, lr in curves})
    columns = {f"lr {lr:g}": [round(100 * best_acc(curves[(c, lr)]), 1) for c in names] for lr in lrs}
    table = pd.DataFrame(columns, index=names)
    print("best val_acc (%) of each grid configuration:")
    print((table if len(names) > 10 else table.T).to_string())
    return {"grid_steps": grid_steps, "best_val_acc": best, "target": target, "reaching": reaching}


def replay_all(args, specs, settings, curves: dict[Key, list[dict]], grid: dict[str, Any], directory: Path) -> dict:
    """Replay every search over the curves for each seed (the grid once) up to ``grid``'s target: its fractions
    of the grid's steps, its finished trials and how many seeds did not reach the target."""
    grid_steps, target = grid["grid_steps"], grid["target"]
    first = recommended(settings, args.warm_start, specs["optuna"])[: args.warm_start] if args.warm_start else None
    rows = {}
    for name, make in algorithms(specs, settings.max_steps, directory, args.max_trials, first).items():
        seeds = [0] if name == "grid" else range(args.seeds)
        runs = [replay(curves, *make(seed), args.workers, target, args.max_trials) for seed in seeds]
        steps = [s if s is not None else spent for s, _, spent in runs]
        rows[name] = {
            "fractions": [s / grid_steps for s in steps],
            "trials": [n for _, n, _ in runs],
            "failed": sum(s is None for s, _, _ in runs),
        }
    return rows


def print_replay(args: argparse.Namespace, asha: dict, grid: dict[str, Any], rows: dict[str, dict]) -> None:
    """The table of the replayed searches."""
    print(
        f"\nREPLAY over the recorded grid curves ({args.workers} trial(s) at once; ASHA grace period {asha['grace_period']}, "
        f"reduction factor {asha['reduction_factor']}; {args.seeds} search seeds): steps to reach {grid['target']:.4f} "
        f"as a fraction of the grid's {grid['grid_steps']} steps"
    )
    print(
        f"{'algorithm':<18} {'mean':>6} {'median':>7} {'IQR':>13} {'min':>6} {'max':>6} {'trials (mean)':>14} {'not reached':>12}  goal"
    )
    for name, row in rows.items():
        f = row["fractions"]
        goal = common.goal(statistics.mean(f) <= 0.2, "<= 0.2") if name == "TPE + ASHA" else ""
        q1, _, q3 = statistics.quantiles(f, n=4) if len(f) > 1 else (f[0], f[0], f[0])
        print(
            f"{name:<18} {statistics.mean(f):6.3f} {statistics.median(f):7.3f} [{q1:5.3f}, {q3:5.3f}] {min(f):6.3f} {max(f):6.3f} "
            f"{statistics.mean(row['trials']):14.1f} {row['failed']:>8}/{len(f):<3}  {goal}"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    asha = asha_scheduler(args)
    with common.scratch("bench_search_") as tmp:
        specs = variants(args, asha, tmp)
        settings = prepare(common.search_options(specs["grid"].path, tmp)).settings
        recorded = grid_curves(args, specs["grid"], settings, tmp)
        curves = usable_curves(recorded, settings, specs["grid"])
        if curves is None:
            return 1
        grid = print_grid(curves, specs["grid"], args.tolerance)
        if args.check:
            for line in check_replay(curves, settings, args.check):
                print(f"replay check, trained again: {line}")
        rows = replay_all(args, specs, settings, curves, grid, tmp)
    print_replay(args, asha, grid, rows)
    common.write_json(args.json, {"args": vars(args), **grid, "rows": rows})
    return 0


def recommended(settings: dict, k: int, spec: SearchSpec) -> list[str]:
    """recommend's ranking of the space's subsets for these settings (its criterion chosen from the evidence)."""
    from vitplast_tune.recommend import ranking

    rec = ranking.recommend(settings, storage.default_storage())
    allowed = set(spec.parameters["components"].grid_values())
    ranked = [c for c in rec.ranked["components"] if c in allowed]
    print(f"warm start: recommend ranks by {rec.criterion}; TPE tries first {', '.join(ranked[:k])}")
    return ranked


def _weights_provenance(settings) -> dict | None:
    """The testbed checkpoint's provenance JSON, when the grid used it."""
    from vitplast_tune.config import TESTBED_MODEL, WEIGHTS_DIR

    path = WEIGHTS_DIR / f"{TESTBED_MODEL}.json"
    if settings.model != TESTBED_MODEL or not settings.pretrained or not path.is_file():
        return None
    import hashlib

    meta = json.loads(path.read_text())
    file = WEIGHTS_DIR / meta["file"]
    return {
        **{k: meta.get(k) for k in ("sha256", "heldout_accuracy", "date", "command")},
        "file_sha256": hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else None,
    }


if __name__ == "__main__":
    raise SystemExit(main())
