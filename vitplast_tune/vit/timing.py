"""Time a few training steps and evaluations on this machine, for the dry run's estimate."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from typing import Any

import torch

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data.batches import eval_batches, train_batches
from vitplast_tune.data.decoded import InMemory
from vitplast_tune.vit import loop
from vitplast_tune.vit.evaluation import _eval_batch_size, evaluate


def time_steps(
    configs: list[FinetuneConfig], device: str, steps: int = 5, budget_s: float = 4.0, decoded: InMemory | None = None
) -> dict[str, Any]:
    """Time the setup, a step and each split's evaluation of runs of ``configs`` on ``device``.

    Each run times a warm-up step, then up to ``steps`` more within ``budget_s`` seconds, then a few evaluation batches.
    "cuda" on a machine without a GPU times the CPU.
    """
    where = torch.device(device if device != "cuda" or torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(where) if where.type == "cuda" else "cpu"
    runs = [_time_run(cfg, where, steps=steps, budget_s=budget_s, decoded=decoded) for cfg in configs]
    return {"device": name, "gpus": torch.cuda.device_count(), "runs": runs}


def _time_run(
    cfg: FinetuneConfig, device: torch.device, *, steps: int, budget_s: float, decoded: InMemory | None
) -> dict[str, Any]:
    """Time one config."""
    entered = time.perf_counter()
    run = loop._prepare(cfg, device, decoded=decoded)
    setup_s = time.perf_counter() - entered
    workers = run.place.loader_workers
    batches = train_batches(run.splits.train, cfg.batch_size, seed=cfg.seed, num_workers=workers, device=device)
    times = []
    while len(times) < steps + 1 and (len(times) < 2 or sum(times[1:]) < budget_s):
        started = time.perf_counter()
        loop._train_step(run, batches).item()  # .item() waits for the step to finish
        times.append(time.perf_counter() - started)
    size = _eval_batch_size(cfg.batch_size)
    evaluation = {}
    for split, dataset in (("val", run.splits.val), ("test", run.splits.test)):
        few = list(itertools.islice(eval_batches(dataset, size, workers, device), 3))
        started = time.perf_counter()
        evaluate(
            run.learner.model,
            few,
            batch_size=size,
            device=device,
            forward=run.learner.forward,
            precision=run.place.precision,
        )
        evaluation[f"{split}_eval_s"] = (time.perf_counter() - started) / len(few) * math.ceil(len(dataset) / size)
    step_s = statistics.median(times[1:])
    return {
        "components": cfg.components,
        "precision": run.place.precision,
        "setup_s": setup_s + times[0] - step_s,  # the first step's one-time work counts as setup
        "step_s": step_s,
        "steps_timed": len(times) - 1,
        **evaluation,
    }
