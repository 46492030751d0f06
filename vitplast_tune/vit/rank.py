"""One rank of a data-parallel run: join the run's process group (``vit.distributed``), finetune as that rank, leave.

Every rank builds the same model from the same seed and starts from rank 0's tensors; rank 0 alone receives
``report`` (it reports and checkpoints for the whole run, as a one-worker run does).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data.decoded import InMemory
from vitplast_tune.vit import devices, distributed, training


def finetune_rank(
    cfg: FinetuneConfig,
    rank: int,
    size: int,
    port: int,
    *,
    report: training.Report | None = None,
    resume: dict[str, Any] | None = None,
    decoded: InMemory | None = None,
) -> training.Finetuned:
    """``training.finetune`` as rank ``rank`` of ``size`` (rank 0 listening on 127.0.0.1:``port``), on the device this
    process was given, with the CPU threads of the run shared among its ranks."""
    device = devices.run_device()
    if cfg.threads:
        cfg = replace(cfg, threads=max(1, cfg.threads // size))
    world = distributed.join(rank, size, port, device)
    try:
        return training.finetune(
            cfg, report=report if rank == 0 else None, resume=resume, device=device, decoded=decoded, world=world
        )
    finally:
        distributed.leave()
