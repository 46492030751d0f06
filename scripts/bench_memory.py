#!/usr/bin/env python
"""Peak memory of a one-trial search: the driver's RSS and the whole process tree's PSS (driver + every Ray process).

Runs ``scripts/search.py`` on a space of one trial (grid, FIFO, full finetuning of a randomly initialised
model, 2 steps of batch 4, ``--no-plasticity``) under its own RAY_TMPDIR, samples /proc every 0.1 s and
prints the peaks for each model, with the paper-scale model's ratio to the testbed's. PSS splits shared
pages between the processes that map them, so the tree's PSS is the extra memory the search takes.

    python scripts/bench_memory.py                       # vit_base_patch16_224 and the testbed ViT
    python scripts/bench_memory.py --models vit_base_patch16_224
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPACE = """
metric: val_acc
mode: max
algorithm: grid
num_samples: 1
scheduler: fifo
parameters:
  components: all
  lr: 0.01
defaults: {{model: {model}, pretrained: false, dataset: {dataset}, max_steps: 2, batch_size: 4, eval_every: 2,
            val_fraction: 0.01, eval_test: false, cache_features: false}}
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="vit_base_patch16_224,vit_testbed_patch8_32", help="comma-separated timm ViTs")
    p.add_argument("--dataset", default="digits", help="dataset of the trial (default: digits)")
    p.add_argument("--json", help="also write the figures to this JSON file")
    return p.parse_args(argv)


def _kb(path: Path, key: str) -> int:
    match = re.search(rf"^{key}:\s+(\d+) kB", path.read_text(), re.M)
    return int(match.group(1)) * 1024 if match else 0


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


def measure(model: str, dataset: str) -> dict[str, float]:
    """Run the one-trial search for ``model``; return peak driver RSS, tree PSS and summed RSS (bytes) and seconds."""
    with tempfile.TemporaryDirectory(prefix="vtm", dir="/tmp") as tmp:
        space = Path(tmp) / "one.yaml"
        space.write_text(SPACE.format(model=model, dataset=dataset))
        env = {**os.environ, "RAY_TMPDIR": tmp}
        cmd = [
            sys.executable,
            str(ROOT / "scripts" / "search.py"),
            "--space",
            str(space),
            "--storage",
            f"{tmp}/results",
            "--no-plasticity",
            "--quiet",
            "--name",
            "memory",
        ]
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        peak = {"driver_rss": 0, "tree_pss": 0, "tree_rss": 0}
        while proc.poll() is None:
            pss = rss = 0
            for pid in _tree(tmp):
                try:
                    pss += _kb(Path(f"/proc/{pid}/smaps_rollup"), "Pss")
                    rss += _kb(Path(f"/proc/{pid}/status"), "VmRSS")
                except OSError:
                    continue
            try:
                driver = _kb(Path(f"/proc/{proc.pid}/status"), "VmRSS")
            except OSError:
                driver = 0
            peak = {
                "driver_rss": max(peak["driver_rss"], driver),
                "tree_pss": max(peak["tree_pss"], pss),
                "tree_rss": max(peak["tree_rss"], rss),
            }
            time.sleep(0.1)
        out = proc.stdout.read()
        if proc.returncode != 0:
            raise RuntimeError(f"the search for {model} failed ({proc.returncode}):\n{out[-3000:]}")
        return {**peak, "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    found = {m: measure(m, args.dataset) for m in models}
    gib = 1e9
    print(f"One-trial search on {args.dataset} (2 steps of batch 4, --no-plasticity): peak memory")
    print(f"{'model':<28} {'driver RSS':>11} {'tree PSS':>9} {'tree RSS':>9}")
    for model, r in found.items():
        print(
            f"{model:<28} {r['driver_rss'] / gib:9.2f} GB {r['tree_pss'] / gib:6.2f} GB {r['tree_rss'] / gib:6.2f} GB"
        )
    if len(models) >= 2:
        a, b = found[models[0]], found[models[1]]
        print(
            f"ratio {models[0]} / {models[1]}: driver {a['driver_rss'] / b['driver_rss']:.2f}x, "
            f"tree PSS {a['tree_pss'] / b['tree_pss']:.2f}x"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
