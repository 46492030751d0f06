"""Stream seeded batches: endless shuffled training batches, resumable at any step, and evaluation in order."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from vitplast_tune.data import transforms
from vitplast_tune.data.splits import SmallImages


class EpochStream(Sampler[int]):
    """Endless indices, epoch after epoch of seeded permutations, from ``start``; with ``part``, one rank's share."""

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
    """Return the seeded shuffle of epoch ``epoch``."""
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
    """Yield endless shuffled training batches on ``device``, resumable at ``start_step``.

    Batch k is the same for a seed whether the stream starts at 0 or resumes at k, random crops included. In-memory data
    is indexed directly and transformed on ``device``; other data goes through a DataLoader. ``part`` (rank, workers)
    gives a data-parallel worker its rows of each batch.
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
                yield _batch(dataset, idx, device, transforms._batch_seed(seed, epoch, b, rank))
            epoch, offset = epoch + 1, 0
    sampler = EpochStream(n, seed, start=start_step * batch_size, part=part, batch_size=batch_size)
    yield from loader(dataset, share, num_workers, device, sampler=sampler, drop_last=True)


def eval_batches(
    dataset: Dataset, batch_size: int, num_workers: int = 0, device: torch.device | str | None = None
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """Return all of ``dataset`` once, in order, in batches; iterable again for each evaluation."""
    device = torch.device(device or "cpu")
    if isinstance(dataset, (SmallImages, TensorDataset)):
        return _InOrder(dataset, batch_size, device)
    return loader(dataset, batch_size, num_workers, device)


def loader(dataset: Dataset, batch_size: int, num_workers: int, device: torch.device, **kwargs: Any) -> DataLoader:
    """Return a DataLoader with persistent workers, and pinned memory when ``device`` is a GPU."""
    return DataLoader(
        dataset,
        batch_size,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=num_workers > 0,
        **kwargs,
    )


class _InOrder:
    """An in-memory dataset in order, in batches, iterable once per evaluation."""

    def __init__(self, dataset: Dataset, batch_size: int, device: torch.device):
        self.dataset, self.batch_size, self.device = dataset, batch_size, device

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(0, len(self.dataset), self.batch_size):
            yield _batch(self.dataset, torch.arange(i, min(i + self.batch_size, len(self.dataset))), self.device)


def _batch(dataset: Dataset, idx: torch.Tensor, device: torch.device, seed: int | None = None):
    """Return batch ``idx`` of an in-memory dataset: transformed on ``device``, or as stored for features."""
    if isinstance(dataset, SmallImages):
        return dataset.batch(idx.numpy(), device, seed)
    images, labels = dataset.tensors
    return images[idx], labels[idx]
