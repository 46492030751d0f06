"""Data parallelism for one run: the ranks of a torch.distributed process group (gloo on CPUs, NCCL on GPUs; Ray
Train starts it, ``run/parallel.py``) each train on their share of every batch, the model in torch
``DistributedDataParallel``, which averages the gradients in buckets while the backward pass runs, so that they step
alike and a run on N workers follows the run on one at the same ``batch_size`` (the images of a micro-batch over all
workers together; each takes ``batch_size / N`` of them, the rows the one worker would have had at its position).

``World`` is what the training loop sees of the group (one process: ``SINGLE``, where every call is a no-op).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from vitplast_tune.data.splits import SmallImages
from vitplast_tune.errors import UserError


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


def data_parallel(module: nn.Module, world: World, device: torch.device) -> nn.Module:
    """``module`` in ``DistributedDataParallel`` over the ranks of ``world`` (itself with one rank).

    Args:
        module: the module of the training forward pass (its frozen parameters take no part).
        world: this process's place among the run's workers.
        device: its device (a GPU: DDP's ``device_ids``).

    Returns:
        The module to train with.
    """
    if world.size == 1:
        return module
    from torch.nn.parallel import DistributedDataParallel

    ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids, broadcast_buffers=False)


def syncing(module: nn.Module, last: bool):
    """The context of one micro-batch's forward and backward: DDP's ``no_sync()`` on all but the ``last`` of a
    step's micro-batches (their gradients accumulate here, the last averages them all), else nothing.

    Args:
        module: the training module (``data_parallel``'s).
        last: whether this is the step's last micro-batch.

    Returns:
        A context manager.
    """
    no_sync = getattr(module, "no_sync", None)
    return contextlib.nullcontext() if last or no_sync is None else no_sync()


def gather_strings(value: str, world: World) -> list[str]:
    """Every rank's ``value``, by rank (``[value]`` alone).

    Args:
        value: this rank's string.
        world: this process's place among the run's workers.

    Returns:
        The ranks' strings, rank 0 first.
    """
    if world.size == 1:
        return [value]
    out: list = [None] * world.size
    dist.all_gather_object(out, value)
    return [str(v) for v in out]


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
