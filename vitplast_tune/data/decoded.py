"""A small dataset decoded once (``InMemory``): uint8 images and labels in numpy arrays, what a search's driver
holds and shares with every trial. No torch here: the driver unpickles it without torch; in a trial,
``data.split_in_memory`` builds the torch datasets from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class InMemory:
    """A small dataset decoded once: uint8 images at native resolution and their labels.

    The search decodes it once before Ray starts, and its driver shares it with every trial through Ray's object
    store (numpy arrays: read zero-copy on each node); each trial draws its seeded train/validation
    split (the test split never moves) and transforms batches on its own device (``data.split_in_memory``).

    Attributes:
        images: uint8 images, (N, C, h, w).
        labels: Integer labels, (N,).
        name: The dataset's name.
        num_classes: The class count; 0 for one more than the largest label.
        test_indices: The indices of a published test split, if the dataset has one.
        test_fraction: The fraction held out, seeded, as the test split when there is no published one.
    """

    images: np.ndarray
    labels: np.ndarray
    name: str = ""
    num_classes: int = 0  # 0: one more than the largest label
    test_indices: np.ndarray | None = None
    test_fraction: float = 0.2

    @property
    def nbytes(self) -> int:
        """Bytes held: the images and labels."""
        return int(self.images.nbytes + self.labels.nbytes)
