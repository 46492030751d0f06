"""Split datasets seeded into train, validation and test, and hold in-memory images with the model's transforms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from vitplast_tune.data import transforms
from vitplast_tune.data.decoded import InMemory

TEST_SEED = 10_007  # the held-out test split of a dataset without one never moves with the run's seed


@dataclass
class Splits:
    """The train, validation and test datasets, each yielding (image tensor, label), and the class count.

    Attributes:
        train: The training split.
        val: The validation split.
        test: The test split.
        num_classes: The number of classes.
    """

    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int


def _split_in_memory(
    decoded: InMemory, seed: int, val_fraction: float, data_config: dict[str, Any], augment: str = "paper"
) -> Splits:
    """Split a decoded dataset seeded, with the model's transforms and the recipe ``augment`` for training."""
    train, val, test = _three_way_split(
        len(decoded.labels), val_fraction, seed, test_fraction=decoded.test_fraction, test=decoded.test_indices
    )
    pick = lambda idx, train: SmallImages(decoded.images, decoded.labels, idx, data_config, train, augment)
    classes = decoded.num_classes or int(decoded.labels.max()) + 1
    return Splits(pick(train, True), pick(val, False), pick(test, False), classes)


def _three_way_split(
    n: int, val_fraction: float, seed: int, *, test_fraction: float = 0.2, test: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return train, validation and test indices: the given test, else a fixed seeded fraction."""
    if test is None:
        rest, test = split_indices(n, test_fraction, seed=TEST_SEED)
    else:
        test = np.asarray(test)
        rest = np.setdiff1d(np.arange(n), test)
    train, val = (rest[i] for i in split_indices(len(rest), val_fraction, seed))
    return train, val, test


def split_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n)`` seeded into (1 - fraction, fraction) index arrays."""
    order = np.random.default_rng(seed).permutation(n)
    cut = n - int(round(n * fraction))
    return np.sort(order[:cut]), np.sort(order[cut:])


class SmallImages(Dataset):
    """Part of an in-memory uint8 dataset, with the model's training or evaluation transform.

    ``batch`` transforms a whole batch on its device; CPU training batches with random crops at large sizes go per
    image.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        indices: np.ndarray,
        data_config: dict,
        train: bool,
        augment: str = "paper",
    ) -> None:
        self.images, self.labels, self.indices = images, labels, np.asarray(indices)
        self.data_config, self.train, self.augment = dict(data_config), train, augment
        self._per_image: Callable | None = None

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        j = self.indices[i]
        return self.transform(_pil(self.images[j])), int(self.labels[j])

    @property
    def transform(self) -> Callable:
        """The per-image transform, built once."""
        if self._per_image is None:
            self._per_image = transforms.per_image(self.data_config, self.train, self.augment)
        return self._per_image

    def batch(
        self, positions: np.ndarray, device: torch.device, seed: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Transform the images at ``positions`` in this part on ``device``, crops and flips seeded by ``seed``."""

        idx = self.indices[positions]
        labels = torch.from_numpy(self.labels[idx].astype(np.int64)).to(device, non_blocking=True)
        recipe = transforms.augmentation(self.augment)
        crops = self.train and recipe.scale is not None
        border = not crops and self.data_config.get("crop_mode") == "border"
        policy = crops and recipe.auto_augment is not None  # timm's RandAugment & co. work on PIL images
        if border or policy or (crops and device.type == "cpu" and cpu_crops_per_image(self.data_config)):
            with transforms.seeded(seed):
                return torch.stack([self.transform(_pil(self.images[j])) for j in idx]).to(device), labels
        raw = torch.from_numpy(self.images[idx]).to(device, non_blocking=True)
        return transforms.batch_transform(raw, self.data_config, self.train, seed, self.augment), labels


# How a CPU-only trial crops its training batches: "per_image", "batched", or "auto", which takes what
# ``python -m benchmarks.data`` measured faster: batched up to ``CPU_BATCHED_UP_TO`` px a side, per image above.
CPU_TRAIN_PATH = "auto"
CPU_BATCHED_UP_TO = 64


def cpu_crops_per_image(data_config: dict[str, Any]) -> bool:
    """Return whether a CPU trial crops its training batches per image rather than batched."""
    if CPU_TRAIN_PATH != "auto":
        return CPU_TRAIN_PATH == "per_image"
    return max(data_config["input_size"][1:]) > CPU_BATCHED_UP_TO


def _pil(image: np.ndarray):
    """Return a uint8 (C, h, w) array as an RGB PIL image."""
    from PIL import Image

    pixels = image[0] if image.shape[0] == 1 else np.ascontiguousarray(image.transpose(1, 2, 0))
    return Image.fromarray(pixels).convert("RGB")
