"""Decode a JPEG dataset once into resized uint8 images on local disk, and read them memory-mapped.

With ``image_cache: N``, each image's shorter side is N pixels; choose N at least the model's resize size (256 for a
224 px model) to keep the evaluation transform unchanged.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from vitplast_tune.config import cache_dir
from vitplast_tune.log import get_logger

VERSION = 1  # bump when the file layout changes
PIXELS, INDEX = "pixels.u8", "index.npy"  # HWC uint8 images one after another; rows of (offset, height, width, label)

log = get_logger(__name__)


def cache_root() -> Path:
    """Return where decoded caches live: ``~/.cache/vitplast_tune/images``."""
    return cache_dir() / "images"


class CachedImages(Dataset):
    """The items of a decoded cache: the transformed image, read as a PIL RGB image, and its label."""

    def __init__(self, directory: str | Path, transform: Callable | None = None):
        self.directory, self.transform = Path(directory), transform
        self.index = np.load(self.directory / INDEX)
        self._pixels: np.memmap | None = None  # opened on first use, in each DataLoader worker

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        from PIL import Image

        if self._pixels is None:
            self._pixels = np.memmap(self.directory / PIXELS, dtype=np.uint8, mode="r")
        offset, height, width, label = (int(v) for v in self.index[i])
        pixels = self._pixels[offset : offset + height * width * 3].reshape(height, width, 3)
        image = Image.fromarray(np.array(pixels))
        return (self.transform(image) if self.transform is not None else image), label

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pixels": None}  # a pickled memmap would carry a copy of every image


def _fingerprint(source: Dataset, key: str) -> str:
    """Hash what a cache of ``source`` holds: ``key``, its root and length, and each file's path, size and time."""
    root = Path(getattr(source, "root", "")).resolve()
    digest = hashlib.sha256(f"{VERSION}|{key}|{root}|{len(source)}".encode())
    for path, label in getattr(source, "samples", ()):
        stat = os.stat(path)
        digest.update(f"|{path}|{label}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


def ensure(source: Callable[[], Dataset], key: str, short_side: int, root: str | Path | None = None) -> Path:
    """Return the folder of the cache of ``source()`` resized to ``short_side``, built first when missing."""
    from filelock import FileLock

    dataset = source()
    root = Path(root) if root is not None else cache_root()
    name = re.sub(r"[^A-Za-z0-9._-]", "-", key)
    directory = root / f"{name}__{short_side}px__{_fingerprint(dataset, key)}"
    if (directory / INDEX).is_file():
        return directory
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory) + ".lock"):
        if not (directory / INDEX).is_file():  # another process may have built it while this one waited
            _build(dataset, directory, short_side, key)
    return directory


def _build(dataset: Dataset, directory: Path, short_side: int, key: str) -> None:
    """Decode, resize and write every image of ``dataset`` into ``directory``, by way of a temporary sibling."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.functional import resize

    partial = directory.with_name(directory.name + f".partial-{os.getpid()}")
    for stale in (partial, directory):  # left by a killed build that had this pid, or a cache without its index
        shutil.rmtree(stale, ignore_errors=True)
    partial.mkdir(parents=True)
    rows, offset, started, said = [], 0, time.perf_counter(), time.perf_counter()
    with open(partial / PIXELS, "wb") as out:
        for i in range(len(dataset)):
            image, label = dataset[i]
            image = image.convert("RGB")
            if min(image.size) > short_side:
                image = resize(image, short_side, interpolation=InterpolationMode.BICUBIC, antialias=True)
            pixels = np.asarray(image, dtype=np.uint8)
            out.write(pixels.tobytes())
            rows.append((offset, pixels.shape[0], pixels.shape[1], int(label)))
            offset += pixels.size
            if time.perf_counter() - said > 10:
                log.info(f"decoding {key} into the image cache: {i + 1}/{len(dataset)} images")
                said = time.perf_counter()
    np.save(partial / INDEX, np.asarray(rows, dtype=np.int64).reshape(-1, 4))
    os.replace(partial, directory)
    seconds = time.perf_counter() - started
    log.info(f"decoded {len(rows)} images of {key} into {directory} ({offset / 1e6:.0f} MB, {seconds:.0f} s)")
