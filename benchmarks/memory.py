"""Peak memory of a one-trial search: the driver's RSS and the whole process tree's PSS (driver + every Ray process).

Runs ``scripts/search.py`` on a space of one trial (grid, FIFO, full finetuning of a randomly initialised
model, 2 steps of batch 4, ``--no-plasticity``) under its own RAY_TMPDIR, samples /proc every 0.1 s and
prints the peaks for each model, with the paper-scale model's ratio to the testbed's. PSS splits shared
pages between the processes that map them, so the tree's PSS is the extra memory the search takes; its
anonymous part (heap, tensors, shared memory) leaves out the mapped library files, which the page cache can
drop. The machine's figure is the rise of its used memory (MemTotal - MemAvailable) over the moment before
the search started: what `free` would show, so run it on an otherwise idle machine. At the tree's peak it
also says how much the driver, the trial and Ray's own processes held. The end of the search is covered too: the
driver's peak RSS once the trial has ended (the results, the best model built in a Ray worker, the study, the
analysis), that worker's peak PSS, and whether the driver ever mapped torch's library. ``--plasticity PAIRS``
measures plasticity first (a Ray task, in that worker), as a default search does.

    python -m benchmarks.memory                         # vit_base_patch16_224 and the testbed ViT
    python -m benchmarks.memory --models vit_base_patch16_224
    python -m benchmarks.memory --models vit_base_patch16_224 --set grad_checkpointing=true
    python -m benchmarks.memory --models vit_testbed_patch8_32 --plasticity 256
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks import common

# The one trial: full finetuning of a randomly initialised model, 2 steps of batch 4, a tiny evaluation.
TRIAL = dict(
    pretrained=False,
    max_steps=2,
    batch_size=4,
    eval_every=2,
    val_fraction=0.01,
    eval_test=False,
    cache_features=False,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--models", default="vit_base_patch16_224,vit_testbed_patch8_32", help="comma-separated timm ViTs")
    p.add_argument("--dataset", default="digits", help="dataset of the trial (default: digits)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another trial setting, e.g. --set grad_checkpointing=true (repeatable)",
    )
    p.add_argument(
        "--plasticity",
        type=common.at_least(0),
        default=0,
        metavar="PAIRS",
        help="measure plasticity on this many image pairs first, as a default search does (default 0: --no-plasticity)",
    )
    common.add_json_flag(p, help="also write the figures to this JSON file")
    return p.parse_args(argv)


def _tree(tmp: str) -> list[int]:
    """Every process started under this RAY_TMPDIR (the driver and the Ray processes it spawned)."""
    mark = f"RAY_TMPDIR={tmp}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


WORKER = "worker"  # the Ray worker with a trial's resources that measures and builds the best model (run.before_trials)


def _group(pid: int, driver: int) -> str:
    """Which part of the search a process is: the driver, a trial (Tune's function trainable), the measuring worker
    or Ray's own."""
    if pid == driver:
        return "driver"
    title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    if title.startswith(b"ray::ImplicitFunc"):
        return "trial"
    return WORKER if title.startswith(b"ray::_Worker") else "Ray's processes"


def _holds_torch(pid: int) -> bool:
    """Whether the process maps torch's shared library (it imported torch)."""
    try:
        return b"libtorch" in Path(f"/proc/{pid}/maps").read_bytes()
    except OSError:
        return False


def _sample(tmp: str, driver: int) -> dict[str, dict[str, int]]:
    """PSS, its anonymous part and RSS (bytes) of every process of the tree, summed per group."""
    groups: dict[str, dict[str, int]] = {}
    for pid in _tree(tmp):
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            rss = common.kb_field(Path(f"/proc/{pid}/status").read_text(), "VmRSS")
            group = _group(pid, driver)
        except OSError:  # the process ended between the listing and the reads
            continue
        sums = groups.setdefault(group, {"pss": 0, "anon": 0, "rss": 0})
        sums["pss"] += common.kb_field(rollup, "Pss")
        sums["anon"] += common.kb_field(rollup, "Pss_Anon") + common.kb_field(rollup, "Pss_Shmem")
        sums["rss"] += rss
    return groups


def _used() -> int:
    """The machine's used memory (bytes): MemTotal - MemAvailable."""
    text = Path("/proc/meminfo").read_text()
    return common.kb_field(text, "MemTotal") - common.kb_field(text, "MemAvailable")


def space_file(directory: Path, model: str, dataset: str, settings: list[str] | tuple[str, ...] = ()) -> Path:
    """The one-trial grid (``settings``: more ``KEY=VALUE`` trial settings, YAML values)."""
    defaults = {"model": model, "dataset": dataset, **TRIAL, **dict(map(common.setting, settings))}
    return common.write_space(directory / "one.yaml", common.grid_space({"components": "all", "lr": 0.01}, defaults))


def _watch(proc: subprocess.Popen, tmp: str, baseline: int) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Sample the tree every 0.1 s until ``proc`` ends: the peaks (bytes; the machine's above ``baseline``), the
    driver's once the trial has ended, the measuring worker's, whether the driver ever held torch, and each group's
    share at the tree's peak."""
    peak = {"driver_rss": 0, "tree_pss": 0, "tree_anon": 0, "tree_rss": 0, "machine": 0, "training_pss": 0}
    peak.update(end_driver_rss=0, worker_pss=0, driver_torch=False)
    at_peak: dict[str, dict[str, int]] = {}
    trained = False
    while proc.poll() is None:
        groups = _sample(tmp, proc.pid)
        total = {key: sum(g[key] for g in groups.values()) for key in ("pss", "anon", "rss")}
        if total["pss"] > peak["tree_pss"]:
            at_peak = groups
        driver = groups.get("driver", {}).get("rss", 0)
        trained = trained or "trial" in groups
        peak = {
            "driver_rss": max(peak["driver_rss"], driver),
            **{f"tree_{key}": max(peak[f"tree_{key}"], value) for key, value in total.items()},
            "machine": max(peak["machine"], _used() - baseline),
            "training_pss": max(peak["training_pss"], total["pss"] if "trial" in groups else 0),
            "end_driver_rss": max(peak["end_driver_rss"], driver if trained and "trial" not in groups else 0),
            "worker_pss": max(peak["worker_pss"], groups.get(WORKER, {}).get("pss", 0)),
            "driver_torch": peak["driver_torch"] or _holds_torch(proc.pid),
        }
        time.sleep(0.1)
    return peak, at_peak


def measure(model: str, dataset: str, settings: list[str] = (), plasticity_pairs: int = 0) -> dict[str, Any]:
    """Run the one-trial search for ``model``; return peak driver RSS, tree PSS (and its anonymous part),
    summed RSS and the machine's rise in used memory, the tree's PSS while the trial ran (bytes), the driver's peak
    RSS after the trial and the measuring worker's peak PSS, whether the driver mapped torch, each group's PSS and
    anonymous PSS at the tree's peak, and seconds."""
    with common.scratch("vtm", dir="/tmp") as tmp:
        plasticity = ["--plasticity-pairs", str(plasticity_pairs)] if plasticity_pairs else ["--no-plasticity"]
        cmd = common.search_command(space_file(tmp, model, dataset, settings), tmp / "results", "memory", *plasticity)
        env = common.python_env(RAY_TMPDIR=str(tmp))
        baseline = _used()
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        peak, at_peak = _watch(proc, str(tmp), baseline)
        out = proc.stdout.read()
        if proc.returncode != 0:
            raise RuntimeError(f"the search for {model} failed ({proc.returncode}):\n{out[-3000:]}")
        return {**peak, "seconds": time.perf_counter() - started, "at_peak": at_peak}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    found = {m: measure(m, args.dataset, args.set, args.plasticity) for m in models}
    gib = 1e9
    measured = f"plasticity on {args.plasticity} pairs" if args.plasticity else "--no-plasticity"
    extra = f", {', '.join(args.set)}" if args.set else ""
    print(f"One-trial search on {args.dataset} (2 steps of batch 4, {measured}{extra}): peak memory")
    print(
        f"{'model':<28} {'driver RSS':>11} {'tree PSS':>9} {'(anon)':>7} {'tree RSS':>9} {'machine':>8} {'training':>9}"
    )
    for model, r in found.items():
        print(
            f"{model:<28} {r['driver_rss'] / gib:8.2f} GB {r['tree_pss'] / gib:6.2f} GB {r['tree_anon'] / gib:7.2f} "
            f"{r['tree_rss'] / gib:6.2f} GB {r['machine'] / gib:5.2f} GB {r['training_pss'] / gib:6.2f} GB"
        )
    print("(training: the tree's PSS while the trial ran; machine: the rise of the machine's used memory)")
    print("The end of the search (after the trial: results, the best model built in a Ray worker, analysis):")
    for model, r in found.items():
        torch_text = "mapped torch" if r["driver_torch"] else "never mapped torch"
        print(
            f"  {model}: driver RSS {r['end_driver_rss'] / gib:.2f} GB at most, the best model's worker "
            f"{r['worker_pss'] / gib:.2f} GB PSS; the driver {torch_text}"
        )
    print("PSS at the tree's peak, per part (anonymous memory in brackets):")
    for model, r in found.items():
        parts = sorted(r["at_peak"].items(), key=lambda kv: -kv[1]["pss"])
        print(f"  {model}: " + ", ".join(f"{k} {v['pss'] / gib:.2f} ({v['anon'] / gib:.2f}) GB" for k, v in parts))
    if len(models) >= 2:
        a, b = found[models[0]], found[models[1]]
        print(
            f"ratio {models[0]} / {models[1]}: driver {a['driver_rss'] / b['driver_rss']:.2f}x, "
            f"tree PSS {a['tree_pss'] / b['tree_pss']:.2f}x"
        )
    common.write_json(args.json, found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
