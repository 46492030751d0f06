"""Data-parallel workers against one: how closely a run on N workers follows the run on one at the same batch (the
relative difference of their losses at each evaluation), and the seconds per optimizer step of each.

    python -m benchmarks.parallel --workers 2 --max-steps 20 --batch-size 32

Each worker is a process of its own (``torch.multiprocessing``, spawned), joined into one process group on
127.0.0.1 (gloo on the CPU, NCCL with ``--device cuda``: one GPU per worker), as ``search/parallel.py`` starts a
trial's ranks in Ray; the one-worker run is ``vt.finetune`` in this process. The testbed ViT untrained, no random
crops (``augment=none``) and fp32, so that only the order of float sums differs between the two.
"""

from __future__ import annotations

import sys
from typing import Any

from benchmarks import common


def settings(args) -> dict[str, Any]:
    """The run both sides make: the testbed on digits, ``--max-steps`` steps of ``--batch-size``."""
    return dict(
        model="vit_testbed_patch8_32",
        pretrained=False,
        components=args.components,
        augment="none",
        precision="fp32",
        lr=0.05,
        warmup_steps=2,
        threads=1,
        batch_size=args.batch_size,
        max_steps=args.max_steps,
        eval_every=max(1, args.max_steps // 4),
        eval_test=False,
    )


def _rank(rank: int, size: int, port: int, values: dict[str, Any], queue) -> None:
    """One worker's run; rank 0 puts its reports (step, train_loss, val_loss, seconds in steps) on ``queue``."""
    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.vit.rank import finetune_rank

    reports: list = []
    finetune_rank(FinetuneConfig(**values), rank, size, port, report=lambda m, s: reports.append(_row(m)))
    if rank == 0:
        queue.put(reports)


def _row(metrics: dict[str, Any]) -> tuple:
    return metrics["step"], metrics["train_loss"], metrics["val_loss"], metrics["time_in_steps_s"]


def compare(args) -> dict[str, Any]:
    """Both runs; their largest relative loss differences and their seconds per step."""
    import torch.multiprocessing as mp

    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.run.parallel import free_port
    from vitplast_tune.vit import training

    values = settings(args)
    one: list = []
    training.finetune(FinetuneConfig(**values), report=lambda m, s: one.append(_row(m)))
    context, port = mp.get_context("spawn"), free_port()
    queue = context.Queue()
    ranks = [context.Process(target=_rank, args=(r, args.workers, port, values, queue)) for r in range(args.workers)]
    for process in ranks:
        process.start()
    many = queue.get(timeout=args.timeout_s)
    for process in ranks:
        process.join()
    rel = lambda i: max(abs(b[i] - a[i]) / abs(a[i]) for a, b in zip(one, many))
    return {
        "workers": args.workers,
        "evaluations": len(one),
        "max_rel_diff_train_loss": rel(1),
        "max_rel_diff_val_loss": rel(2),
        "s_per_step_one": one[-1][3] / args.max_steps,
        "s_per_step_many": many[-1][3] / args.max_steps,
    }


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--components", default="all")
    p.add_argument("--timeout-s", type=float, default=900.0)
    common.add_json_flag(p)
    args = p.parse_args(argv)
    result = compare(args)
    print(
        f"{result['workers']} workers against 1 at batch {args.batch_size}, {result['evaluations']} evaluations: "
        f"largest relative difference of train_loss {result['max_rel_diff_train_loss']:.2e}, of val_loss "
        f"{result['max_rel_diff_val_loss']:.2e}; seconds per step {result['s_per_step_many']:.3f} vs "
        f"{result['s_per_step_one']:.3f} ({result['s_per_step_many'] / result['s_per_step_one']:.2f}x)"
    )
    common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
