"""Which training augmentation fits a dataset: finetune the testbed ViT with each recipe at several learning rates and
subsets, and compare the best validation accuracy each reaches (test accuracy of its best-validation weights beside).

    python -m benchmarks.augment --dataset digits --recipes paper light none --lrs 0.01 0.03 0.1 0.3 --workers 2

Each run is ``vt.finetune`` (400 steps at batch 64 unless ``--max-steps``) in its own process with one torch thread,
as one CPU trial of the quickstart trains (``--device cuda`` runs them on a GPU instead, with the batched transform).
Rows are printed (and appended to ``--out`` as JSON lines) as runs finish; the table at the end gives, per recipe,
the mean and the best over the runs, and per subset the best over learning rates. ``--deadline-s`` stops
scheduling new runs after that many seconds (the runs are ordered so that a cut keeps whole (lr, subset) cells).

Recipes besides the registered ones (``paper``, ``light``, ``none``), for the comparison only:
``noflip`` (the paper's crop, no flip), ``crop50`` (RandomResizedCrop 50-100%, no flip), ``flip`` (no crop, a flip).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import common

EXTRA = {
    "noflip": dict(scale=(0.08, 1.0), hflip=0.0),
    "crop50": dict(scale=(0.5, 1.0), hflip=0.0),
    "flip": dict(scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.5),
}


def register_extra() -> None:
    """Register the comparison-only recipes (``EXTRA``) in this process."""
    from vitplast_tune.data import transforms

    for name, recipe in EXTRA.items():
        if name not in transforms.AUGMENTATIONS:
            transforms.register_augmentation(transforms.Augmentation(name, **recipe))


def one_run(job: dict[str, Any]) -> dict[str, Any]:
    """Finetune once (``job``: FinetuneConfig fields and ``device``); the accuracies and the seconds it took."""
    import torch

    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.vit.training import finetune

    register_extra()
    torch.set_num_threads(1)
    settings = {k: v for k, v in job.items() if k != "device"}
    started = time.perf_counter()
    _, metrics = finetune(FinetuneConfig(**settings, threads=1), device=torch.device(job["device"]))
    return {
        **job,
        "best_val_acc": metrics["best_val_acc"],
        "val_acc": metrics["val_acc"],
        "test_acc": metrics.get("test_acc"),
        "seconds": time.perf_counter() - started,
        "time_in_steps_s": metrics.get("time_in_steps_s"),
    }


def jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (dataset, lr, subset, seed, recipe) run, recipes innermost so that a deadline cuts whole cells."""
    cells = itertools.product(args.dataset, args.lrs, args.components, args.seeds, args.recipes)
    return [
        dict(
            dataset=d,
            lr=lr,
            components=c,
            seed=s,
            augment=r,
            max_steps=args.max_steps,
            model=args.model,
            device=args.device,
        )
        for d, lr, c, s, r in cells
    ]


def run_all(todo: list[dict[str, Any]], workers: int, deadline_s: float, out: Path | None) -> list[dict[str, Any]]:
    """Run the jobs in ``workers`` processes (spawned), printing each row as it finishes; stop scheduling at the
    deadline."""
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with mp.get_context("spawn").Pool(workers, maxtasksperchild=8) as pool:
        pending = [pool.apply_async(one_run, (job,)) for job in todo]
        for handle in pending:
            left = deadline_s - (time.monotonic() - started)
            try:
                row = handle.get(timeout=min(max(left, 0.1) + 120, 1e6))
            except mp.TimeoutError:
                print(f"deadline: {len(rows)} of {len(todo)} runs finished", flush=True)
                pool.terminate()
                break
            rows.append(row)
            print(_row_text(row), flush=True)
            if out is not None:
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    return rows


def _row_text(row: dict[str, Any]) -> str:
    return (
        f"{row['dataset']:<9} {row['augment']:<7} lr={row['lr']:<6g} {row['components']:<8} seed={row['seed']} "
        f"best_val {100 * row['best_val_acc']:6.2f}%  test {100 * (row['test_acc'] or 0):6.2f}%  {row['seconds']:.0f} s"
    )


def summary(rows: list[dict[str, Any]]) -> str:
    """Per dataset and recipe: mean and best of best_val_acc over runs; per subset the best over learning rates."""
    import pandas as pd

    if not rows:
        return "no runs finished"
    frame = pd.DataFrame(rows)
    lines = []
    for dataset, part in frame.groupby("dataset", sort=False):
        per = part.groupby("augment", sort=False)
        table = pd.DataFrame(
            {
                "runs": per.size(),
                "mean best_val": per["best_val_acc"].mean().map(lambda v: f"{100 * v:.2f}%"),
                "max best_val": per["best_val_acc"].max().map(lambda v: f"{100 * v:.2f}%"),
                "mean test": per["test_acc"].mean().map(lambda v: f"{100 * v:.2f}%"),
                "s/run": per["seconds"].mean().map(lambda v: f"{v:.1f}"),
            }
        )
        best_lr = part.groupby(["augment", "components"], sort=False)["best_val_acc"].max().unstack()
        by_lr = part.groupby(["augment", "lr"], sort=False)["best_val_acc"].mean().unstack()
        lines += [
            f"{dataset}:",
            table.to_string(),
            "best over learning rates, per subset (best_val_acc %):",
            (100 * best_lr).round(2).to_string(),
            "mean over subsets, per learning rate (best_val_acc %):",
            (100 * by_lr).round(2).to_string(),
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison from the command line; print the rows and the summary."""
    p = common.parser(__doc__)
    p.add_argument("--dataset", nargs="+", default=["digits"])
    p.add_argument(
        "--recipes", nargs="+", type=common.known(["paper", "light", "none"]), default=["paper", "light", "none"]
    )
    p.add_argument("--lrs", nargs="+", type=common.above(0), default=[0.01, 0.03, 0.1, 0.3])
    p.add_argument("--components", nargs="+", type=common.subset, default=["all", "mha", "fc1"])
    p.add_argument("--seeds", nargs="+", type=common.at_least(0), default=[0])
    p.add_argument("--max-steps", type=common.at_least(1), default=400)
    p.add_argument("--model", default="vit_testbed_patch8_32.fractal")
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=common.at_least(1), default=2)
    p.add_argument("--deadline-s", type=common.above(0), default=float("inf"))
    p.add_argument("--out", type=common.output_path, help="append each run as a JSON line to this file")
    p.add_argument("--summarize", type=Path, nargs="*", help="only print the summary of these JSON-lines files")
    args = p.parse_args(argv)
    if args.summarize:
        rows = [json.loads(line) for path in args.summarize for line in path.read_text().splitlines() if line]
    else:
        rows = run_all(jobs(args), args.workers, args.deadline_s, args.out)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
