"""Hold a small dataset decoded once, in numpy arrays the driver shares without torch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class InMemory:
    """A small dataset decoded once: uint8 images at native resolution and their labels.

    The driver decodes it before Ray starts and shares it with every trial through Ray's object store; each trial draws
    its seeded split and transforms its batches on its own device.

    Attributes:
        images: uint8 images, (N, C, h, w).
        labels: Integer labels, (N,).
        name: The dataset's name.
        num_classes: The class count; 0 for one more than the largest label.
        test_indices: The indices of a published test split, if any.
        test_fraction: The seeded fraction held out as the test split when there is no published one.
    """

    images: np.ndarray
    labels: np.ndarray
    name: str = ""
    num_classes: int = 0  # 0: one more than the largest label
    test_indices: np.ndarray | None = None
    test_fraction: float = 0.2

    @property
    def nbytes(self) -> int:
        """Bytes held by the images and labels."""
        return int(self.images.nbytes + self.labels.nbytes)
