"""Train one run on several data-parallel workers: each rank trains on its share of every batch under DDP."""

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
    """This process's ``rank`` among a run's ``size`` data-parallel workers."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Whether this is rank 0, which reports, checkpoints and returns the model."""
        return self.rank == 0

    def rows(self, n: int) -> slice:
        """Return this rank's rows of a batch of ``n`` images."""
        share = n // self.size
        return slice(self.rank * share, (self.rank + 1) * share)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Return ``values`` summed over the ranks."""
        if self.size > 1:
            values = values.clone()
            dist.all_reduce(values)
        return values

    def broadcast(self, tensors: Iterable[torch.Tensor]) -> None:
        """Copy rank 0's values into every rank's ``tensors``, in place."""
        if self.size > 1:
            for tensor in tensors:
                dist.broadcast(tensor.data, src=0)


SINGLE = World()


def data_parallel(module: nn.Module, world: World, device: torch.device) -> nn.Module:
    """Wrap ``module`` in ``DistributedDataParallel`` when ``world`` has several ranks."""
    if world.size == 1:
        return module
    from torch.nn.parallel import DistributedDataParallel

    ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids, broadcast_buffers=False)


def _syncing(module: nn.Module, last: bool):
    """Return DDP's ``no_sync()`` for all but a step's last micro-batch, else a null context."""
    no_sync = getattr(module, "no_sync", None)
    return contextlib.nullcontext() if last or no_sync is None else no_sync()


def gather_strings(value: str, world: World) -> list[str]:
    """Return every rank's ``value``, rank 0 first."""
    if world.size == 1:
        return [value]
    out: list = [None] * world.size
    dist.all_gather_object(out, value)
    return [str(v) for v in out]


def _check_batch(batch_size: int, world: World, mixing: bool) -> None:
    """Refuse a batch that the ranks cannot share evenly, or that leaves a rank an odd share under mixup."""
    if batch_size % world.size:
        raise UserError(f"batch_size {batch_size} does not divide among the trial's {world.size} workers")
    if mixing and (batch_size // world.size) % 2:
        raise UserError(
            f"mixup and cutmix pair images within each worker's {batch_size // world.size}: make batch_size a "
            f"multiple of {2 * world.size}"
        )


def _shard(dataset: Dataset, world: World) -> Dataset:
    """Return this rank's part of an evaluation split: every ``size``-th image from its ``rank``."""
    if world.size == 1:
        return dataset
    if isinstance(dataset, SmallImages):
        picked = dataset.indices[world.rank :: world.size]
        return SmallImages(dataset.images, dataset.labels, picked, dataset.data_config, dataset.train, dataset.augment)
    if isinstance(dataset, TensorDataset):
        return TensorDataset(*(t[world.rank :: world.size] for t in dataset.tensors))
    return Subset(dataset, range(world.rank, len(dataset), world.size))
