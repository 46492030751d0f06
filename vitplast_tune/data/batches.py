"""Seeded batch streams: endless shuffled training batches (resumable at any step) and evaluation in order."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from vitplast_tune.data import transforms
from vitplast_tune.data.splits import SmallImages


class EpochStream(Sampler[int]):
    """Endless indices: epoch after epoch of seeded permutations, starting ``start`` samples in; with ``part``
    (rank, workers) and ``batch_size``, only that rank's share of each batch of ``batch_size``."""

    def __init__(self, n: int, seed: int, start: int = 0, part: tuple[int, int] = (0, 1), batch_size: int = 1):
        self.n, self.seed, self.start, self.part, self.batch_size = n, seed, start, part, batch_size

    def __iter__(self) -> Iterator[int]:
        rank, workers = self.part
        share = self.batch_size // workers
        epoch, offset = divmod(self.start, self.n)
        position = self.start
        while True:
            for index in epoch_permutation(self.n, self.seed, epoch)[offset:].tolist():
                if workers == 1 or (position % self.batch_size) // share == rank:
                    yield index
                position += 1
            epoch, offset = epoch + 1, 0


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The deterministic shuffle of epoch ``epoch`` for ``seed``."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def train_batches(
    dataset: Dataset,
    batch_size: int,
    *,
    seed: int,
    start_step: int = 0,
    num_workers: int = 0,
    device: torch.device | str | None = None,
    part: tuple[int, int] = (0, 1),
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless shuffled training batches on ``device`` (default: the CPU), resumable at ``start_step``.

    Batch ``k`` is the same for a given seed whether the stream starts at 0 or resumes at ``k``
    (for in-memory data, its random crops and flips too). In-memory datasets are indexed directly
    (last partial batch of an epoch dropped) and transformed on ``device``; others go through one
    DataLoader with persistent workers, and pinned memory when ``device`` is a GPU. ``part`` (rank, workers): a
    data-parallel worker's share of each batch, the rows ``rank * batch_size / workers`` onwards (its random crops
    drawn from a seed of its own; the first worker's are the first ones of the one-worker batch).
    """
    device = torch.device(device or "cpu")
    n = len(dataset)
    rank, workers = part
    share = batch_size // workers
    if isinstance(dataset, (SmallImages, TensorDataset)):
        per_epoch = max(n // batch_size, 1)
        epoch, offset = divmod(start_step, per_epoch)
        while True:
            order = epoch_permutation(n, seed, epoch)
            for b in range(offset, per_epoch):
                idx = order[b * batch_size : (b + 1) * batch_size][rank * share : (rank + 1) * share]
                yield _batch(dataset, idx, device, transforms.batch_seed(seed, epoch, b, rank))
            epoch, offset = epoch + 1, 0
    sampler = EpochStream(n, seed, start=start_step * batch_size, part=part, batch_size=batch_size)
    yield from loader(dataset, share, num_workers, device, sampler=sampler, drop_last=True)


def eval_batches(
    dataset: Dataset, batch_size: int, num_workers: int = 0, device: torch.device | str | None = None
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """All of ``dataset`` once, in order, in batches of ``batch_size`` (on ``device`` for in-memory data).

    The result can be iterated again (once per evaluation): a DataLoader's persistent workers stay.
    """
    device = torch.device(device or "cpu")
    if isinstance(dataset, (SmallImages, TensorDataset)):
        return _InOrder(dataset, batch_size, device)
    return loader(dataset, batch_size, num_workers, device)


def loader(dataset: Dataset, batch_size: int, num_workers: int, device: torch.device, **kwargs: Any) -> DataLoader:
    """A DataLoader with persistent workers, and pinned memory when ``device`` is a GPU."""
    return DataLoader(
        dataset,
        batch_size,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=num_workers > 0,
        **kwargs,
    )


class _InOrder:
    """An in-memory dataset in order, in batches: iterable once per evaluation."""

    def __init__(self, dataset: Dataset, batch_size: int, device: torch.device):
        self.dataset, self.batch_size, self.device = dataset, batch_size, device

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(0, len(self.dataset), self.batch_size):
            yield _batch(self.dataset, torch.arange(i, min(i + self.batch_size, len(self.dataset))), self.device)


def _batch(dataset: Dataset, idx: torch.Tensor, device: torch.device, seed: int | None = None):
    """Batch ``idx`` of an in-memory dataset: transformed on ``device`` (uint8 images), or as stored (features)."""
    if isinstance(dataset, SmallImages):
        return dataset.batch(idx.numpy(), device, seed)
    images, labels = dataset.tensors
    return images[idx], labels[idx]
