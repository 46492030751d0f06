"""Trial efficiency: the fraction of a real Ray Tune trial's wall time spent in training and
evaluation steps (goal: >= 0.9), and where the rest goes.

Runs one trial through ``vitplast_tune.run_search`` (a one-configuration grid written to a temp
directory, plasticity off, MLflow and checkpoints as in any search) on a Ray instance started here
with ``--cpus`` CPUs and shut down after. The trial's wall time runs from its actor start to its
completion, both seen by a Tune callback on the driver; the time in steps and in evaluation is
what finetune reports (``time_in_steps_s``, ``time_in_eval_s``). The rest is split into
finetune's setup (model build, data split, freezing, feature cache), the trial's startup before
finetune, reports and checkpoints in the trial, driver round trips (Tune and the MLflow callback)
and the trial's shutdown.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ray.tune import Callback

from benchmarks import common
from vitplast_tune.run.driver import run as run_search


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--model", default="vit_testbed_patch8_32", help="timm model (default: vit_testbed_patch8_32)")
    p.add_argument(
        "--pretrained",
        action="store_true",
        help="load the model's pretrained weights (default: random init, as timing does not depend on them)",
    )
    p.add_argument("--dataset", default="digits", help="dataset (default: digits)")
    p.add_argument(
        "--components", type=common.subset, default="all", help="the trial's subset (default: all, full finetuning)"
    )
    p.add_argument("--lr", type=common.above(0), default=0.03, help="learning rate (default: 0.03)")
    p.add_argument(
        "--max-steps", type=common.at_least(1), default=400, help="training steps (default: 400, the testbed spaces')"
    )
    p.add_argument(
        "--eval-every",
        type=common.at_least(1),
        default=50,
        help="evaluate, report and checkpoint every N steps (default: 50)",
    )
    p.add_argument("--batch-size", type=common.at_least(1), default=64, help="batch size (default: 64)")
    p.add_argument(
        "--cpus",
        type=common.at_least(1),
        default=1,
        help="CPUs of the Ray instance and of the trial (its torch threads) (default: 1)",
    )
    p.add_argument("--gpus", type=common.at_least(0, float), default=0, help="GPUs of the trial (default: 0)")
    common.add_json_flag(p)
    return p.parse_args(argv)


class Timeline(Callback):
    """Driver-side wall-clock times of the experiment start, the trial's start, each result and its completion."""

    def __init__(self):
        self.setup_at = self.start = self.complete = None
        self.results: list[tuple[float, dict]] = []

    def setup(self, **info) -> None:
        self.setup_at = time.time()

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.start = time.time()

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.results.append((time.time(), dict(result)))

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.complete = time.time()


def space_file(directory: Path, args: argparse.Namespace) -> Path:
    """A one-trial grid: the given subset and learning rate, no early stopping."""
    space = common.grid_space(
        {"components": {"choice": [args.components]}, "lr": {"choice": [args.lr]}, "optimizer": "sgd"},
        {
            "model": args.model,
            "pretrained": args.pretrained,
            "dataset": args.dataset,
            "max_steps": args.max_steps,
            "batch_size": args.batch_size,
            "eval_every": args.eval_every,
            "warmup_steps": 40,
        },
        description="bench_trial: one trial",
    )
    return common.write_space(directory / "bench_trial.yaml", space)


def breakdown(timeline: Timeline) -> dict[str, float]:
    """Seconds of the trial's wall time, by where they went (they add up to the wall time)."""
    (_, first), (last_at, last) = timeline.results[0], timeline.results[-1]
    work_1 = first["time_setup_s"] + first["time_in_steps_s"] + first["time_in_eval_s"]
    work = last["time_setup_s"] + last["time_in_steps_s"] + last["time_in_eval_s"]
    return {
        "training steps": last["time_in_steps_s"],
        "evaluation (val, test)": last["time_in_eval_s"],
        "finetune setup (model, data split, freeze, cache)": last["time_setup_s"],
        "trial startup before finetune (+ 1st report)": first["time_total_s"] - work_1,
        "reports + checkpoints in the trial": (last["time_total_s"] - first["time_total_s"]) - (work - work_1),
        "driver round trips (Tune, MLflow callback)": (last_at - timeline.start) - last["time_total_s"],
        "trial shutdown after the last result": timeline.complete - last_at,
    }


def run_trial(args: argparse.Namespace) -> tuple[Timeline, Any, dict[str, float]]:
    """Run the trial on a Ray instance of its own; return its timeline, run's result and the wall-clock
    moments before ray.init (started), after it (ray_up), after run (returned) and after ray.shutdown (finished)."""
    timeline = Timeline()
    with common.scratch("bench_trial_") as tmp:
        at = {"started": time.time()}
        with common.local_ray(args.cpus, int(args.gpus > 0)):
            at["ray_up"] = time.time()
            options = common.search_options(
                space_file(tmp, args),
                tmp,
                name="bench_trial",
                cpus_per_trial=args.cpus,
                gpus_per_trial=args.gpus,
                verbose=0,
            )
            result = run_search(options, callbacks=[timeline])
            at["returned"] = time.time()
        at["finished"] = time.time()
    return timeline, result, at


def print_trial(args: argparse.Namespace, timeline: Timeline) -> tuple[float, dict[str, float], float]:
    """Print the trial's wall time, where it went and the fraction in steps; return the three."""
    last = timeline.results[-1][1]
    wall = timeline.complete - timeline.start
    parts = breakdown(timeline)
    fraction = (last["time_in_steps_s"] + last["time_in_eval_s"]) / wall
    print(
        f"One {args.components} trial of {args.model} on {args.dataset}: {int(last['step'])} steps at batch {args.batch_size}, "
        f"eval every {args.eval_every}, {args.cpus} CPU(s){f', {args.gpus:g} GPU' if args.gpus else ''}; "
        f"val_acc {last['val_acc']:.3f}"
    )
    print(f"trial wall time (actor start -> complete): {wall:.1f} s")
    for name, seconds in parts.items():
        print(f"  {name:<50} {seconds:7.2f} s  {seconds / wall:6.1%}")
    print(f"fraction in training + evaluation steps: {fraction:.3f}  (goal >= 0.9: {common.verdict(fraction >= 0.9)})")
    return wall, parts, fraction


def print_outside(timeline: Timeline, at: dict[str, float]) -> tuple[dict[str, float], float, float]:
    """Print the whole run's time outside the trial; return it by part, the whole run's seconds and the
    fraction in steps counted from Tune's start (the actor's creation included)."""
    last = timeline.results[-1][1]
    outside = {
        "ray.init": at["ray_up"] - at["started"],
        "run before Tune started (validation, MLflow parent run, data decoding)": timeline.setup_at - at["ray_up"],
        "Tune start -> the trial's actor started (worker process, imports)": timeline.start - timeline.setup_at,
        "run after the trial (trial table, summary)": at["returned"] - timeline.complete,
        "ray.shutdown": at["finished"] - at["returned"],
    }
    total = at["finished"] - at["started"]
    print(
        f"whole run (ray.init -> ray.shutdown): {total:.1f} s; fraction in steps + evaluation {(last['time_in_steps_s'] + last['time_in_eval_s']) / total:.3f}; outside the trial:"
    )
    for name, seconds in outside.items():
        print(f"  {name:<80} {seconds:6.2f} s")
    with_actor = (last["time_in_steps_s"] + last["time_in_eval_s"]) / (timeline.complete - timeline.setup_at)
    print(
        f"fraction from Tune start, counting the actor's creation (paid once per concurrent trial slot: actors are reused): {with_actor:.3f}"
    )
    return outside, total, with_actor


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    timeline, result, at = run_trial(args)
    if timeline.complete is None or not timeline.results or "time_in_steps_s" not in timeline.results[-1][1]:
        print("error: the trial did not finish; see the Ray logs", file=sys.stderr)
        return 1
    wall, parts, fraction = print_trial(args, timeline)
    outside, total, with_actor = print_outside(timeline, at)
    common.write_json(
        args.json,
        {
            "args": vars(args),
            "wall_s": wall,
            "fraction": fraction,
            "fraction_with_actor_start": with_actor,
            "parts_s": parts,
            "outside_s": outside,
            "total_s": total,
            "trials": len(result.trials),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
