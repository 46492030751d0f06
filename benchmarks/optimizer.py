"""What timm's optimizer factory changes on the testbed quickstart: the same full-finetuning runs (seeds, fixed
learning rates) with the hand-written optimizer trials used before (weight decay on every trainable parameter)
and with ``timm.optim.create_optimizer_v2`` (no decay on biases, norms, position embedding and class token;
optionally layer-wise lr decay). Accuracy only, so the numbers do not depend on the machine's load.

    python -m benchmarks.optimizer --workers 2            # the default grid: SGD and AdamW, 3 seeds
    python -m benchmarks.optimizer --workers 16 --json out.json

Each run is one ``finetune`` of the quickstart's settings (the shipped testbed ViT on digits, 400 steps at batch
64, all components) in a worker process with one torch thread, on the CPU in fp32.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

from benchmarks import common

# (optimizer, lr, weight decay, layer decay): SGD at 5e-4 and AdamW at timm's usual 0.05, and AdamW with layer-wise
# decay 0.75 (the factory's only). At the quickstart's weight decay 0 the factory takes exactly the plain optimizer's
# steps (tests/vit/test_training.py checks it), so the grid leaves that out.
GRID = [("sgd", lr, 5e-4, None) for lr in (0.03, 0.1)] + [("adamw", 1e-3, 0.05, ld) for ld in (None, 0.75)]
SEEDS = (0, 1, 2)


def plain_optimizer(cfg, model, device):
    """The optimizer trials used before timm's factory: torch's SGD (classical momentum) or AdamW, every trainable
    parameter in one group with the same weight decay."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def one_run(job: dict) -> dict:
    """``finetune`` of one (optimizer, lr, weight decay, layer decay, seed, variant) on the quickstart's settings."""
    import torch

    from vitplast_tune.vit import loop, training

    torch.set_num_threads(1)
    factory = one_run.__dict__.setdefault("factory", loop.build_optimizer)  # a worker runs several jobs
    loop.build_optimizer = plain_optimizer if job["variant"] == "torch" else factory
    keys = ("optimizer", "lr", "weight_decay", "layer_decay", "seed", "max_steps")
    cfg = training.FinetuneConfig(components="all", threads=1, precision="fp32", **{k: job[k] for k in keys})
    _, final = training.finetune(cfg, device=torch.device("cpu"))
    return {**job, **{k: final[k] for k in ("best_val_acc", "val_acc", "test_acc", "train_loss")}}


def jobs(seeds=SEEDS, max_steps: int = 400) -> list[dict]:
    """Every run: each grid row and seed with the plain optimizer and with timm's (layer decay: timm's only)."""
    out = []
    for (opt, lr, wd, ld), seed in itertools.product(GRID, seeds):
        for variant in ("timm",) if ld else ("torch", "timm"):
            job = dict(optimizer=opt, lr=lr, weight_decay=wd, layer_decay=ld, seed=seed, max_steps=max_steps)
            out.append({**job, "variant": variant})
    return out


def table(runs: list[dict]) -> str:
    """Mean over seeds per row and variant, and the paired difference timm - torch of test accuracy."""
    key = lambda r: (r["optimizer"], r["lr"], r["weight_decay"], r["layer_decay"])
    lines = ["optimizer     lr   wd     layer_decay  variant  best_val_acc  test_acc (mean over seeds)  timm - torch"]
    for row, group in itertools.groupby(sorted(runs, key=lambda r: (str(key(r)), r["variant"])), key=key):
        group = list(group)
        by = {v: [r for r in group if r["variant"] == v] for v in ("torch", "timm")}
        for variant, rs in by.items():
            if not rs:
                continue
            val, test = (statistics.mean(r[k] for r in rs) for k in ("best_val_acc", "test_acc"))
            diff = ""
            if variant == "timm" and by["torch"]:
                pairs = {r["seed"]: r["test_acc"] for r in by["torch"]}
                deltas = [r["test_acc"] - pairs[r["seed"]] for r in rs]
                diff = f"{100 * statistics.mean(deltas):+.2f} pts (per seed {', '.join(f'{100 * d:+.2f}' for d in deltas)})"
            opt, lr, wd, ld = row
            lines.append(
                f"{opt:<8} {lr:>7g} {wd:<6g} {ld or '-':<12} {variant:<8} {100 * val:>11.2f}%  {100 * test:>8.2f}%"
                f"{'':<18}  {diff}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every job on ``--workers`` processes, print the table, optionally write every run to ``--json``."""
    p = common.parser(__doc__)
    p.add_argument(
        "--workers", type=common.at_least(1), default=2, help="runs at once, one torch thread each (default: 2)"
    )
    common.add_json_flag(p, "write every run's metrics to this file")
    p.add_argument(
        "--seeds", type=common.at_least(1), default=len(SEEDS), help=f"seeds per row (default: {len(SEEDS)})"
    )
    p.add_argument(
        "--max-steps", type=common.at_least(1), default=400, help="steps per run (default: 400, the quickstart's)"
    )
    args = p.parse_args(argv)
    runs = []
    with ProcessPoolExecutor(args.workers) as pool:
        for run in pool.map(one_run, jobs(SEEDS[: args.seeds], args.max_steps)):
            runs.append(run)  # each run as it ends: a long measurement shows its progress, and a stopped one its part
            print(json.dumps(run), file=sys.stderr, flush=True)
    print(table(runs))
    common.write_json(args.json, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
