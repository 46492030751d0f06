"""How the driver's cost grows with the number of trials, beside the stack a user would assemble by hand.

N trials of a trivially cheap trainable (``cheap_trial``: a few reports, no torch, no checkpoint) run through

* **vitplast**: this project's driver path (``run.driver.execute`` with the cheap trainable: Optuna TPE + ASHA, the
  MLflow parent and trial runs, the live Optuna study, the progress lines, then the end phase: trial table, study,
  analysis), and
* **hand-assembled**: Ray Tune's ``Tuner`` with ``OptunaSearch`` (TPE), ``ASHAScheduler`` and
  ``MLflowLoggerCallback`` over the same parameters (six component flags and a log-uniform learning rate), with the
  two Tune settings the project's Tuner has too, so that the difference is the project's own work: actors reused
  (Tune's default starts a process per trial) and Tune's CSV and JSON loggers without its TensorBoard logger (whose
  tensorboardX imports torch into the driver),

each in a fresh driver process on a local Ray instance of ``--cpus`` CPUs (one per trial). For each N it prints
the driver's CPU seconds per trial (user + system of the driver process, every thread, from just before the search
to its return: imports, Ray's start and the plan's checks left out), the wall seconds per trial and the driver's
peak RSS, with the ratios the goal reads: vitplast's CPU per trial over the hand-assembled stack's at the same N,
and over its own at the smallest N. Each measurement is written to ``--json`` as it ends, and a run given the same
file skips the ones it holds (so a long run can be stopped and continued, one N at a time).

    python -m benchmarks.scale --trials 100,1000,3000 --json /tmp/scale.json
    python -m benchmarks.scale --trials 100 --stacks vitplast --profile /tmp/prof   # py-spy or pyinstrument
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from vitplast_tune.components import COMPONENTS

STACKS = ("vitplast", "hand-assembled")
REPORTS, EVERY = 4, 10  # each trial reports at steps 10, 20, 30, 40 (ASHA's rungs at 10 and 20)
LR = (1e-3, 1.0)
SPACE = {
    "description": "the scale benchmark: TPE + ASHA over the component flags and the learning rate",
    "metric": "val_acc",
    "mode": "max",
    "algorithm": "optuna",
    "num_samples": 1,
    "scheduler": {"name": "asha", "grace_period": EVERY, "reduction_factor": 2},
    "parameters": {"components": {"subsets": "any"}, "lr": {"loguniform": list(LR)}},
    "defaults": {"max_steps": REPORTS * EVERY, "eval_every": EVERY},
}


def parse_args(argv: list[str] | None = None):
    p = common.parser(__doc__)
    p.add_argument(
        "--trials",
        type=common.listed(common.at_least(1)),
        default="100,1000,3000",
        help="comma-separated numbers of trials (default 100,1000,3000)",
    )
    p.add_argument(
        "--stacks",
        type=common.listed(common.known(STACKS)),
        default=",".join(STACKS),
        help=f"comma-separated, of {', '.join(STACKS)}",
    )
    p.add_argument(
        "--cpus", type=common.at_least(1), default=2, help="CPUs of the local Ray instance, one per trial (default 2)"
    )
    p.add_argument("--again", action="store_true", help="measure again what the --json file already holds")
    p.add_argument(
        "--profile",
        type=common.output_dir,
        help="profile vitplast's driver into this folder (py-spy, else pyinstrument)",
    )
    p.add_argument("--child", nargs=4, metavar=("STACK", "N", "DIR", "CPUS"), help=argparse.SUPPRESS)
    common.add_json_flag(p, help="write each measurement here as it ends; a run given it again skips those")
    return p.parse_args(argv)


def score(config: dict[str, Any]) -> float:
    """The accuracy a cheap trial reaches: higher with more components and a learning rate nearer 0.05 (TPE and ASHA
    have something to find), from the project's ``components`` or the hand-assembled stack's ``train_*`` flags."""
    subset = config.get("components")
    trained = len(str(subset).split("+")) if subset else sum(bool(config.get(f"train_{c}")) for c in COMPONENTS)
    lr = float(config.get("lr", 0.05))
    return 0.5 + 0.05 * trained - 0.05 * abs(math.log10(lr / 0.05))


def cheap_trial(config: dict[str, Any]) -> None:
    """A Ray Tune function trainable that trains nothing: ``REPORTS`` reports of the metrics a trial reports."""
    from ray import tune

    final, steps = score(config), REPORTS * EVERY
    for i in range(1, REPORTS + 1):
        acc = final * (0.6 + 0.4 * i / REPORTS)
        metrics = {"step": i * EVERY, "max_steps": steps, "val_acc": acc, "best_val_acc": acc, "best_step": i * EVERY}
        metrics.update(val_loss=1 - acc, train_loss=1 - acc, trainable_params=1000, steps_per_s=100.0)
        if i == REPORTS:
            metrics["test_acc"] = acc
        tune.report(metrics)


def run_vitplast(n: int, directory: Path) -> tuple[int, tuple[float, float]]:
    """This project's driver path over ``n`` cheap trials: the trials that ended, and ``_clock()`` at its start."""
    from vitplast_tune.plan import prepare
    from vitplast_tune.run import driver

    space = common.write_space(directory / "scale.yaml", SPACE)
    plan = prepare(common.search_options(space, directory, name="scale", num_samples=n, verbose=1))
    started = _clock()
    result = driver.execute(plan, trainable=cheap_trial)
    return len(result.trials), started


def run_hand_assembled(n: int, directory: Path) -> tuple[int, tuple[float, float]]:
    """Ray Tune + OptunaSearch + ASHAScheduler + MLflowLoggerCallback over ``n`` cheap trials, as a user writes it:
    the trials that ended, and ``_clock()`` at its start."""
    import os

    from ray import tune
    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"

    param_space = {f"train_{c}": tune.choice([False, True]) for c in COMPONENTS}
    param_space["lr"] = tune.loguniform(*LR)
    started = _clock()
    tuner = tune.Tuner(
        tune.with_resources(cheap_trial, {"cpu": 1}),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric="val_acc",
            mode="max",
            num_samples=n,
            search_alg=OptunaSearch(seed=0),
            scheduler=ASHAScheduler(time_attr="step", max_t=REPORTS * EVERY, grace_period=EVERY, reduction_factor=2),
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name="scale",
            storage_path=str(directory / "results"),
            callbacks=[
                MLflowLoggerCallback(tracking_uri=f"sqlite:///{directory / 'mlflow.db'}", experiment_name="scale"),
                CSVLoggerCallback(),
                JsonLoggerCallback(),
            ],
        ),
    )
    return len(tuner.fit()), started


def _clock() -> tuple[float, float]:
    """This process's CPU seconds (every thread) and the wall clock."""
    return time.process_time(), time.perf_counter()


def child(stack: str, n: int, directory: Path, cpus: int) -> dict[str, Any]:
    """One measurement in this (fresh) process: the search of ``stack`` over ``n`` trials on a local Ray instance of
    ``cpus`` CPUs."""
    with common.local_ray(cpus):
        ended, (cpu0, wall0) = (run_vitplast if stack == "vitplast" else run_hand_assembled)(n, directory)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"stack": stack, "trials": n, "ended": ended, "cpu_s": cpu, "wall_s": wall, "peak_rss": peak}


def measure(stack: str, n: int, cpus: int, profile: str | None = None) -> dict[str, Any]:
    """Run ``child`` in a fresh driver process (its output in the scratch folder's log); its figures."""
    with common.scratch("vts", dir="/tmp") as tmp:
        cmd = [sys.executable, "-m", "benchmarks.scale", "--child", stack, str(n), str(tmp), str(cpus)]
        if profile:
            cmd = _profiled(cmd, Path(profile) / f"{stack}-{n}")
        env = common.python_env(RAY_TMPDIR=str(tmp))
        log = tmp / "child.log"
        with open(log, "w") as out:
            proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=common.ROOT)
        text = log.read_text()
        lines = [line for line in text.splitlines() if line.startswith("SCALE ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{stack} at N={n} failed ({proc.returncode}):\n{text[-3000:]}")
        return json.loads(lines[-1].removeprefix("SCALE "))


def _profiled(cmd: list[str], out: Path) -> list[str]:
    """``cmd`` under py-spy (a flame graph) when installed, else pyinstrument (an HTML report)."""
    import shutil

    out.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which("py-spy"):
        return ["py-spy", "record", "--rate", "50", "--format", "speedscope", "-o", f"{out}.json", "--", *cmd]
    return [sys.executable, "-m", "pyinstrument", "-r", "html", "-o", f"{out}.html", *cmd[1:]]


def table(found: list[dict[str, Any]]) -> str:
    """The side-by-side table: per N and stack, driver CPU and wall seconds per trial and peak RSS, and the ratios."""
    by = {(r["stack"], r["trials"]): r for r in found}
    sizes = sorted({r["trials"] for r in found})
    own = by.get(("vitplast", sizes[0])) if sizes else None
    lines = [
        f"{'N':>6} {'stack':<15} {'CPU s/trial':>11} {'wall s/trial':>12} {'peak RSS':>9} {'CPU vs hand':>11} "
        f"{'CPU vs own N=' + str(sizes[0]) if sizes else '':>14}"
    ]
    for n in sizes:
        for stack in STACKS:
            r = by.get((stack, n))
            if r is None:
                continue
            cpu = r["cpu_s"] / n
            peer = by.get(("hand-assembled", n))
            vs_peer = f"{cpu / (peer['cpu_s'] / n):.2f}x" if stack == "vitplast" and peer else ""
            vs_own = f"{cpu / (own['cpu_s'] / own['trials']):.2f}x" if stack == "vitplast" and own else ""
            lines.append(
                f"{n:>6} {stack:<15} {cpu:>11.3f} {r['wall_s'] / n:>12.3f} {r['peak_rss'] / 1e9:>6.2f} GB "
                f"{vs_peer:>11} {vs_own:>14}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        stack, n, directory, cpus = args.child
        print("SCALE " + json.dumps(child(stack, int(n), Path(directory), int(cpus))), flush=True)
        return 0
    path = Path(args.json) if args.json else None
    found = json.loads(path.read_text()) if path is not None and path.is_file() and not args.again else []
    stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
    for n in [int(t) for t in args.trials.split(",")]:
        for stack in stacks:
            if any(r["stack"] == stack and r["trials"] == n for r in found):
                continue
            found = [r for r in found if (r["stack"], r["trials"]) != (stack, n)]
            found.append(measure(stack, n, args.cpus, args.profile))
            print(f"measured {stack} at N={n}: {found[-1]['cpu_s']:.1f} s of driver CPU", flush=True)
            common.write_json(path, found)
    print(f"Driver cost of N cheap trials ({args.cpus} at a time, {REPORTS} reports each), one fresh driver each:")
    print(table(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
