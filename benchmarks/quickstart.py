"""Where the quickstart's time goes: run the README's main command (``scripts/search.py --space component_subsets``)
and break its time down.

    python -m benchmarks.quickstart [--storage DIR] [--name NAME] [-- more search flags]

It prints: the command's wall clock (process start to exit); the search's own phase timings (the ``Time:`` line of
its summary: imports, checks and data, Ray start, plasticity, gradient criteria, MLflow records, trials, Ray stop,
results, analysis); the CPU seconds of every process the search started, by kind (its driver, the trial actors, the
measurement tasks, Ray's own processes), sampled from /proc every ``--every`` seconds (every process of the search
shares the benchmark's own RAY_TMPDIR, and only they do); where the trials' time went (trials.csv: training steps,
evaluation and set-up, summed over trials; the steps trained against the 60 x 400 a search without early stopping
trains); and the best validation accuracy. On a machine shared with other work the wall clock also measures the
other work, while CPU seconds stay close to the search's own: their sum over 2 cores is a lower bound of its wall
clock alone.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd

from benchmarks import common
from benchmarks.common import ROOT, python_env, scratch

IDLE = "idle Ray workers"
KINDS = (  # process kind by the start of its command line (Ray names its workers after what they run)
    ("ray::ImplicitFunc", "trial actors"),
    ("ray::_measure", "measurement tasks"),
    ("ray::IDLE", IDLE),
    ("ray::", "other Ray workers"),
)


class CpuSampler(threading.Thread):
    """Every ``every`` seconds, the CPU seconds (user + system) of each live process whose environment holds
    ``RAY_TMPDIR=<tmpdir>``; a process's last reading stands after it exits."""

    def __init__(self, tmpdir: str, driver_pid: int, every: float):
        super().__init__(daemon=True)
        self.tag, self.driver, self.every = f"RAY_TMPDIR={tmpdir}".encode(), str(driver_pid), every
        self.seen: dict[str, tuple[str, float]] = {}
        self.done = threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")

    def run(self) -> None:
        while not self.done.is_set():
            for environ in glob.glob("/proc/[0-9]*/environ"):
                self._read(environ.split("/")[2])
            self.done.wait(self.every)

    def _read(self, pid: str) -> None:
        try:
            if self.tag not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / self.tick
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            return
        kind, before = self.seen.get(pid, (IDLE, 0.0))
        self.seen[pid] = (self._kind(pid, command) if kind == IDLE else kind, max(cpu, before))  # a worker's first job

    def _kind(self, pid: str, command: str) -> str:
        if pid == self.driver:
            return "driver"
        if "_inspect_in_child" in command:
            return "input check (child process)"
        for prefix, kind in KINDS:
            if command.startswith(prefix):
                return kind
        return "Ray's own processes (GCS, raylet, ...)"

    def totals(self) -> dict[str, float]:
        """CPU seconds by process kind."""
        found: dict[str, float] = {}
        for kind, cpu in self.seen.values():
            found[kind] = found.get(kind, 0.0) + cpu
        return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def run_search(storage: Path, name: str, flags: list[str], every: float) -> tuple[str, float, dict[str, float]]:
    """The README's main command into ``storage``/``name``; its output, wall seconds and CPU seconds by kind."""
    command = [sys.executable, str(ROOT / "scripts" / "search.py"), "--space", "component_subsets"]
    command += ["--name", name, "--storage", str(storage), *flags]
    with scratch("vtq", dir="/tmp") as tmp:  # short: Ray's socket paths must stay under 108 bytes
        env = python_env(RAY_TMPDIR=str(tmp), PYTHONUNBUFFERED="1")
        started = time.perf_counter()
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sampler = CpuSampler(str(tmp), proc.pid, every)
        sampler.start()
        lines = []
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)
        proc.wait()
        seconds = time.perf_counter() - started
        sampler.done.set()
        sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"the search failed (exit {proc.returncode})")
    return "".join(lines), seconds, sampler.totals()


def trial_breakdown(trials: pd.DataFrame) -> list[str]:
    """Where the trials' own time went, from the trial table, and the steps early stopping saved."""
    steps, budget = int(trials["step"].fillna(0).sum()), int(trials["max_steps"].iloc[0]) * len(trials)
    sums = {k: trials[k].fillna(0).sum() for k in ("time_in_steps_s", "time_in_eval_s", "time_setup_s") if k in trials}
    best = trials.loc[trials["best_val_acc"].idxmax()]
    return [
        f"trials: {len(trials)}, {steps:,} steps trained of the {budget:,} a search without early stopping trains "
        f"({100 * steps / budget:.0f}%); {int((trials['step'] >= trials['max_steps']).sum())} trained their whole budget",
        "summed over trials: "
        + ", ".join(f"{k.removeprefix('time_').removesuffix('_s')} {v:.1f} s" for k, v in sums.items()),
        f"best validation accuracy {100 * best['best_val_acc']:.2f}% ({best['components']}, lr {best['lr']:.3g})",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the quickstart and print its breakdown."""
    p = common.parser(__doc__)
    p.add_argument(
        "--storage", type=lambda text: Path(common.output_dir(text)), help="results folder (default: a temporary one)"
    )
    p.add_argument("--name", default="quickstart-benchmark")
    p.add_argument("--every", type=common.above(0), default=2.0, help="seconds between CPU readings (default: 2)")
    p.add_argument("flags", nargs="*", help="more search flags, after --")
    args = p.parse_args(argv)
    with scratch("vitplast-quickstart-") as tmp:
        storage = args.storage or tmp
        output, seconds, cpu = run_search(storage, args.name, args.flags, args.every)
        trials = pd.read_csv(storage / args.name / "trials.csv", dtype={"trial_id": str})
    phases = next((line for line in output.splitlines() if line.startswith("Time: ")), "Time: (not printed)")
    print("\nWhere the quickstart's time went")
    print(f"wall clock of the command: {seconds:.1f} s")
    print(f"the search's phases: {phases.removeprefix('Time: ')}")
    total = sum(cpu.values())
    shares = ", ".join(f"{kind} {value:.1f} s" for kind, value in cpu.items())
    print(f"CPU seconds by process: {shares}; total {total:.1f} s = {total / 2:.1f} s on 2 cores")
    print("\n".join(trial_breakdown(trials)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
