"""Data parallelism for one run: the ranks of a torch.distributed process group (gloo on CPUs, NCCL on GPUs) each
train on their share of every batch and average their gradients before each optimizer step, so that they step alike
and a run on N workers follows the run on one at the same ``batch_size`` (the images of a micro-batch over all
workers together; each takes ``batch_size / N`` of them, the rows the one worker would have had at its position).

``World`` is what the training loop sees (one process: ``SINGLE``, where every call is a no-op); ``join`` starts a
rank's process group and ``run_rank`` trains as that rank (``search/parallel.py`` starts the ranks of a trial).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, Subset, TensorDataset

from vitplast_tune.data.splits import SmallImages
from vitplast_tune.errors import UserError

TIMEOUT_S = 600.0  # how long a rank waits for the others at a collective before it fails


@dataclass(frozen=True)
class World:
    """Where this process stands among a run's data-parallel workers: its ``rank`` of ``size``."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Whether this is rank 0, which reports, checkpoints and returns the model."""
        return self.rank == 0

    def rows(self, n: int) -> slice:
        """This rank's rows of a batch of ``n`` images (``n`` divisible by ``size``)."""
        share = n // self.size
        return slice(self.rank * share, (self.rank + 1) * share)

    def average_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Replace each gradient by its mean over the ranks (one all-reduce of them all, flattened)."""
        if self.size == 1:
            return
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.size
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the ranks (as they are on one)."""
        if self.size > 1:
            values = values.clone()
            dist.all_reduce(values)
        return values

    def broadcast(self, tensors: Iterable[torch.Tensor]) -> None:
        """Rank 0's values into every rank's ``tensors`` (in place), so that every rank starts alike."""
        if self.size > 1:
            for tensor in tensors:
                dist.broadcast(tensor.data, src=0)


SINGLE = World()


def check_batch(batch_size: int, world: World, mixing: bool) -> None:
    """UserError unless each of the ``world``'s ranks gets the same whole share of a batch (even, with mixup)."""
    if batch_size % world.size:
        raise UserError(f"batch_size {batch_size} does not divide among the trial's {world.size} workers")
    if mixing and (batch_size // world.size) % 2:
        raise UserError(
            f"mixup and cutmix pair images within each worker's {batch_size // world.size}: make batch_size a "
            f"multiple of {2 * world.size}"
        )


def shard(dataset: Dataset, world: World) -> Dataset:
    """This rank's part of an evaluation split (every ``size``-th image from its ``rank``); the whole split alone."""
    if world.size == 1:
        return dataset
    if isinstance(dataset, SmallImages):
        picked = dataset.indices[world.rank :: world.size]
        return SmallImages(dataset.images, dataset.labels, picked, dataset.data_config, dataset.train, dataset.augment)
    if isinstance(dataset, TensorDataset):
        return TensorDataset(*(t[world.rank :: world.size] for t in dataset.tensors))
    return Subset(dataset, range(world.rank, len(dataset), world.size))


def join(rank: int, size: int, port: int, device: torch.device) -> World:
    """Join the run's process group on this machine (rank 0 listens on 127.0.0.1:``port``): NCCL on a GPU, else
    gloo. Returns this rank's ``World``."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
        **({"device_id": device} if device.type == "cuda" else {}),
    )
    return World(rank, size)


def leave() -> None:
    """Leave the process group (if this process is in one)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
