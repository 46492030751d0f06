"""Generate offline tasks into the cache on first use: corrupted digits, and fractal classes the testbed never saw.

Each is written once, by an atomic rename, as ``<cache>/datasets/<name>-<code hash>.npz``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vitplast_tune.config import cache_dir
from vitplast_tune.data import corruptions
from vitplast_tune.data.decoded import InMemory

SIZE = 32  # the corruptions' parameters are CIFAR-10-C's, for 32-px images
SEVERITY = 5  # the paper's
NOVEL_CLASS_SEED = 1  # the testbed (and its seed-1 twin) pretrained on the classes of seed 0
NOVEL_CLASSES = 32
NOVEL_PER_CLASS = 40
CORRUPTIONS = tuple(corruptions.CORRUPTIONS)  # the options of digits_c and fractals_novel_c


def digits_c(corruption: str) -> InMemory:
    """Return scikit-learn's digits at 32 px under a CIFAR-10-C corruption at severity 5, cached."""
    if corruption not in corruptions.CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}")

    def make() -> tuple[np.ndarray, np.ndarray]:
        images, labels = upscaled_digits(SIZE)
        return corruptions.corrupt(images, corruption, SEVERITY, seed=0), labels

    return InMemory(*_cached(f"digits_c-{corruption}-s{SEVERITY}", make))


def fractals_novel() -> InMemory:
    """Return ``NOVEL_PER_CLASS`` instances of each of ``NOVEL_CLASSES`` fractal classes of class seed 1, cached."""

    def make() -> tuple[np.ndarray, np.ndarray]:
        from vitplast_tune.data.fractals import fractal_dataset

        images, labels = fractal_dataset(NOVEL_CLASSES, NOVEL_PER_CLASS, SIZE, seed=NOVEL_CLASS_SEED)
        pixels = images.mul(255.0).round_().clamp_(0, 255).numpy().astype(np.uint8)
        return pixels, labels.numpy().astype(np.int64)

    return InMemory(*_cached(f"fractals_novel-{NOVEL_CLASSES}x{NOVEL_PER_CLASS}-c{NOVEL_CLASS_SEED}", make))


def fractals_novel_c(corruption: str) -> InMemory:
    """Return ``fractals_novel`` under a CIFAR-10-C corruption at severity 5, cached."""
    if corruption not in corruptions.CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}")
    clean = fractals_novel()

    def make() -> tuple[np.ndarray, np.ndarray]:
        return corruptions.corrupt(clean.images, corruption, SEVERITY, seed=0), clean.labels

    return InMemory(*_cached(f"fractals_novel_c-{corruption}-s{SEVERITY}", make))


def upscaled_digits(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return scikit-learn's digits as uint8 (N, 3, size, size), resized by PIL's bilinear filter, and labels."""
    from PIL import Image
    from sklearn.datasets import load_digits

    bunch = load_digits()
    small = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    big = np.stack([np.asarray(Image.fromarray(d).resize((size, size), Image.BILINEAR)) for d in small])
    return np.ascontiguousarray(np.repeat(big[:, None], 3, axis=1)), bunch.target.astype(np.int64)


def _cached(key: str, make: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Read images and labels from the cache, making and writing them first when missing."""
    path = cache_dir() / "datasets" / f"{key}-{_code_hash()}.npz"
    if not path.is_file():
        images, labels = make()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, images=images, labels=labels)
        os.replace(tmp, path)
    with np.load(path) as data:
        return data["images"], data["labels"]


def _code_hash() -> str:
    """Hash the modules that make the generated data."""
    digest = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for module in ("generated.py", "corruptions.py", "fractals.py"):
        digest.update((here / module).read_bytes())
    return digest.hexdigest()[:12]
