"""Data-parallel steps on the CPU: a 2-worker step with torch DDP (what a trial of several workers trains with) against
the same step with the hand-written flattened all-reduce it replaced (kept here only, for this comparison) and
against one worker at the same global batch; the peak RSS of each worker; and what Ray Train costs a trial to start.

    python -m benchmarks.parallel --model vit_small_patch16_224 --batch-size 8 --steps 4 --rounds 3

Each worker is a process of its own (``torch.multiprocessing``, spawned) in one gloo process group on 127.0.0.1, one
thread each; the one worker is a spawned process too, with one thread, at the whole batch. The three variants run in
turn, round after round (interleaved, so that a busy machine slows each alike), and the ratios are per round. Every
variant trains the same seeded model (timm, no pretrained weights) on the same seeded images, full finetuning, SGD.
``--train-start`` also times a Ray Train run of N workers whose loop does nothing (``TorchTrainer.fit``), beside a
Ray task that does nothing: the fixed cost a trial of several workers pays for its Train run.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

from benchmarks import common

VARIANTS = ("one", "ddp", "flat")  # one worker at the whole batch; 2 workers with DDP; 2 with the old all-reduce


def flat_average(params, size: int) -> None:
    """The hand-written gradient mean the project used before DDP: every gradient copied into one flat tensor, one
    all-reduce after the backward pass, and copied back (no buckets, no overlap with the backward pass)."""
    import torch
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def _worker(rank: int, size: int, port: int, job: dict[str, Any], queue) -> None:
    """One worker's timed steps; puts (rank, seconds per step after the first, peak RSS in bytes) on ``queue``."""
    import resource

    import timm
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    if size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    torch.manual_seed(0)
    model = timm.create_model(job["model"], pretrained=False, num_classes=10)
    trained = model
    if job["variant"] == "ddp":
        trained = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    size_px = model.default_cfg["input_size"][-1]
    images = torch.randn(job["batch_size"], 3, size_px, size_px, generator=generator)
    labels = torch.randint(0, 10, (job["batch_size"],), generator=generator)
    share = job["batch_size"] // size
    rows = slice(rank * share, (rank + 1) * share)
    times = []
    for _ in range(job["steps"] + 1):
        started = time.perf_counter()
        loss = F.cross_entropy(trained(images[rows]), labels[rows])
        loss.backward()
        if job["variant"] == "flat":
            flat_average(model.parameters(), size)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    if size > 1:
        dist.destroy_process_group()
    queue.put((rank, statistics.median(times[1:]), peak))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_variant(variant: str, args) -> dict[str, Any]:
    """One variant's workers, spawned and joined: seconds per step (the slowest worker's) and each worker's peak RSS."""
    import torch.multiprocessing as mp

    size = 1 if variant == "one" else args.workers
    job = {"variant": variant, "model": args.model, "batch_size": args.batch_size, "steps": args.steps}
    context, port = mp.get_context("spawn"), _free_port()
    queue = context.Queue()
    workers = [context.Process(target=_worker, args=(r, size, port, job, queue)) for r in range(size)]
    for process in workers:
        process.start()
    results = sorted(queue.get(timeout=args.timeout_s) for _ in workers)
    for process in workers:
        process.join()
    return {"s_per_step": max(r[1] for r in results), "peak_rss_gib": [r[2] / 2**30 for r in results]}


def train_start(workers: int, repeats: int) -> dict[str, float]:
    """Seconds a Ray Train run of ``workers`` gloo workers takes when its loop does nothing, and a Ray task that does
    nothing, on a local Ray instance of this process (each the median of ``repeats``); and this process's RSS before
    its first Train run and its peak after the last (what launching Train runs costs the process that launches them,
    a trial's own process)."""
    import resource

    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        noop = ray.remote(num_cpus=0.5)(lambda: None)
        ray.get(noop.remote())  # the first worker process started
        task, train = [], []
        before = _rss()
        for _ in range(repeats):
            started = time.perf_counter()
            ray.get(noop.remote())
            task.append(time.perf_counter() - started)
            trainer = TorchTrainer(
                lambda: None,
                scaling_config=ray.train.ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 0.5}),
                run_config=ray.train.RunConfig(storage_path=tempfile.mkdtemp(prefix="train-start-")),
                torch_config=TorchConfig(backend="gloo"),
            )
            started = time.perf_counter()
            trainer.fit()
            train.append(time.perf_counter() - started)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        return {
            "train_run_s": statistics.median(train),
            "ray_task_s": statistics.median(task),
            "launcher_rss_before_gib": before / 2**30,
            "launcher_peak_rss_gib": peak / 2**30,
        }
    finally:
        ray.shutdown()


def _rss() -> int:
    """This process's resident set size now, in bytes (Linux)."""
    with open("/proc/self/status") as status:
        kib = next(line for line in status if line.startswith("VmRSS:")).split()[1]
    return int(kib) * 1024


def compare(args) -> dict[str, Any]:
    """Every round of the three variants; the ratios per round and their medians."""
    rounds = []
    for _ in range(args.rounds):
        rounds.append({v: run_variant(v, args) for v in VARIANTS})
    ratio = lambda a, b: [r[a]["s_per_step"] / r[b]["s_per_step"] for r in rounds]
    result = {
        "model": args.model,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "rounds": rounds,
        "ddp_over_flat": ratio("ddp", "flat"),
        "ddp_over_one": ratio("ddp", "one"),
        "flat_over_one": ratio("flat", "one"),
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    if args.train_start:
        result["train_start"] = train_start(args.workers, args.train_start)
    return result


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__)
    p.add_argument("--model", default="vit_small_patch16_224")
    p.add_argument("--workers", type=common.at_least(1), default=2)
    p.add_argument(
        "--batch-size", type=common.at_least(1), default=8, help="the global batch (each of N workers takes 1/N)"
    )
    p.add_argument(
        "--steps", type=common.at_least(1), default=4, help="timed steps per variant and round, after a first one"
    )
    p.add_argument("--rounds", type=common.at_least(1), default=3)
    p.add_argument("--train-start", type=common.at_least(0), default=3, help="Train runs timed (0: none)")
    p.add_argument("--timeout-s", type=common.above(0), default=1800.0)
    common.add_json_flag(p)
    args = p.parse_args(argv)
    result = compare(args)
    median = statistics.median
    peaks = {v: max(max(r[v]["peak_rss_gib"]) for r in result["rounds"]) for v in VARIANTS}
    print(
        f"{args.model}, batch {args.batch_size}, {args.workers} gloo workers (1 thread each), {args.rounds} rounds "
        f"(load {result['load']}): s/step DDP / flattened all-reduce {median(result['ddp_over_flat']):.2f}x "
        f"(rounds {', '.join(f'{x:.2f}' for x in result['ddp_over_flat'])}); DDP / 1 worker "
        f"{median(result['ddp_over_one']):.2f}x; flattened / 1 worker {median(result['flat_over_one']):.2f}x; peak RSS "
        f"per worker: 1 worker {peaks['one']:.2f} GiB, DDP {peaks['ddp']:.2f} GiB, flattened {peaks['flat']:.2f} GiB"
    )
    if "train_start" in result:
        start = result["train_start"]
        print(
            f"a Train run of {args.workers} workers doing nothing: {start['train_run_s']:.1f} s "
            f"(a Ray task doing nothing: {start['ray_task_s']:.3f} s); the launching process's RSS "
            f"{start['launcher_rss_before_gib']:.2f} GiB before, peak {start['launcher_peak_rss_gib']:.2f} GiB after"
        )
    common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
