"""Datasets, their train/validation/test splits, transforms, and seeded batch streams.

A registry maps a dataset name to a loader. Every loader returns ``Splits``: a seeded 80/20
train/validation split of the train set (as in the paper) and the test split for the final
evaluation. Transforms follow the model's own timm data config (resolution, mean/std,
interpolation, crop); training adds the paper's RandomResizedCrop + horizontal flip.

Names: ``digits`` (scikit-learn's digits, offline, the default), ``fractals`` (the generated
pretraining / plasticity-reference distribution, offline), ``cifar10``, ``cifar100``, ``pets``,
``flowers102`` (torchvision, ``download=True`` fetches them), ``cifar10c:<corruption>`` (the
published .npy files in ``data_dir``), and ``imagefolder`` (``data_dir`` with ``train/`` and
optionally ``test/`` class folders; DomainNet fits this shape).
"""

from __future__ import annotations

import contextlib
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from vitplast_tune.config import default_data_dir  # re-exported: data.default_data_dir
from vitplast_tune.data import transforms
from vitplast_tune.data.decoded import InMemory  # re-exported: data.InMemory
from vitplast_tune.data.splits import Splits, split_in_memory, split_indices, three_way_split
from vitplast_tune.errors import UserError, did_you_mean

CIFAR10C_CORRUPTIONS = (
    "brightness",
    "contrast",
    "defocus_blur",
    "elastic_transform",
    "fog",
    "frost",
    "gaussian_blur",
    "gaussian_noise",
    "glass_blur",
    "impulse_noise",
    "jpeg_compression",
    "motion_blur",
    "pixelate",
    "saturate",
    "shot_noise",
    "snow",
    "spatter",
    "speckle_noise",
    "zoom_blur",
)


Loader = Callable[..., "Splits | InMemory"]
_DATASETS: dict[str, Loader] = {}
_NUM_CLASSES: dict[str, int] = {}
_FROM_FILES: set[str] = set()  # loaders that read image files lazily, and take ``image_cache``


def register_dataset(name: str, num_classes: int | None = None, from_files: bool = False) -> Callable[[Loader], Loader]:
    """Decorator adding a loader ``fn(data_config, root, download, seed, val_fraction)``.

    A loader returns ``Splits``, or ``InMemory`` for a small dataset that is decoded once.

    ``num_classes`` lets a model get its head before the data is loaded (None: read from disk).
    ``from_files``: the loader reads image files lazily and also takes ``image_cache`` (see image_cache.py).
    """

    def add(fn: Loader) -> Loader:
        _DATASETS[name] = fn
        if num_classes is not None:
            _NUM_CLASSES[name] = num_classes
        if from_files:
            _FROM_FILES.add(name)
        return fn

    return add


def num_classes(name: str, data_dir: str | Path | None = None) -> int:
    """Number of classes of dataset ``name`` without loading it."""
    check_dataset_name(name)
    family = name.partition(":")[0]
    if family in _NUM_CLASSES:
        return _NUM_CLASSES[family]
    return len(imagefolder_classes(_root(data_dir)))


def list_datasets() -> list[str]:
    """Registered dataset names (``cifar10c`` takes ``:<corruption>``)."""
    return sorted(_DATASETS)


def check_dataset_name(name: str) -> None:
    """Raise UserError unless ``name`` is a registered dataset (with a valid CIFAR-10-C corruption)."""
    family, _, option = name.partition(":")
    if family not in _DATASETS:
        raise UserError(
            f'unknown dataset "{name}"{did_you_mean(family, _DATASETS)}; known: {", ".join(list_datasets())}'
        )
    if family == "cifar10c" and option not in CIFAR10C_CORRUPTIONS:
        raise UserError(
            f'dataset "{name}" needs a corruption, e.g. "cifar10c:snow"; one of {", ".join(CIFAR10C_CORRUPTIONS)}'
        )


def load_dataset(
    name: str,
    data_config: dict[str, Any],
    *,
    data_dir: str | Path | None = None,
    download: bool = False,
    seed: int = 0,
    val_fraction: float = 0.2,
    decoded: InMemory | None = None,
    image_cache: int = 0,
) -> Splits:
    """Load dataset ``name`` with transforms for ``data_config`` (see ``models.data_config``).

    ``decoded`` (from ``decode_dataset``) skips decoding a small dataset again. ``image_cache`` > 0 reads
    a JPEG dataset from a one-time decode resized to that shorter side (image_cache.py; built when missing).
    Raises UserError with what to do when the data is missing and ``download`` is off, or when a download fails.
    """
    fits = decoded is not None and decoded.name == name
    loaded = decoded if fits else _load(name, data_config, data_dir, download, seed, val_fraction, image_cache)
    return split_in_memory(loaded, seed, val_fraction, data_config) if isinstance(loaded, InMemory) else loaded


def decode_dataset(
    name: str, data_config: dict[str, Any], *, data_dir=None, download: bool = False, image_cache: int = 0
) -> InMemory | None:
    """Decode a small dataset once, uint8 at native resolution; None for datasets read lazily from disk
    (whose image cache, with ``image_cache`` > 0, is built here when missing)."""
    loaded = _load(name, data_config, data_dir, download, 0, 0.2, image_cache)
    return loaded if isinstance(loaded, InMemory) else None


def _load(name, data_config, data_dir, download, seed, val_fraction, image_cache=0) -> Splits | InMemory:
    check_dataset_name(name)
    family, _, option = name.partition(":")
    kwargs = dict(
        data_config=data_config, root=_root(data_dir), download=download, seed=seed, val_fraction=val_fraction
    )
    if option:
        kwargs["option"] = option
    if family in _FROM_FILES:
        kwargs["image_cache"] = image_cache
    loaded = _DATASETS[family](**kwargs)
    if isinstance(loaded, InMemory):
        loaded.name, loaded.num_classes = name, _NUM_CLASSES.get(family, 0)
    return loaded


def _root(data_dir: str | Path | None) -> Path:
    return Path(data_dir).expanduser() if data_dir is not None else default_data_dir()


# ----------------------------------------------------------------------------- offline datasets


@register_dataset("digits", num_classes=10)
def _digits(data_config, root, download, seed, val_fraction) -> InMemory:
    """scikit-learn's 1,797 8x8 digits (shipped with the package), kept 8x8 and one channel."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    return InMemory(images, bunch.target.astype(np.int64))


@register_dataset("fractals", num_classes=64)
def _fractals(data_config, root, download, seed, val_fraction) -> InMemory:
    """Formula-driven IFS fractals (generated, deterministic) rendered at the model's resolution, as uint8."""
    from vitplast_tune.data.fractals import fractal_dataset

    images, labels = fractal_dataset(image_size=data_config["input_size"][-1])
    return InMemory(_to_uint8(images), labels.numpy().astype(np.int64))


def _to_uint8(images: torch.Tensor) -> np.ndarray:
    """Float images in [0, 1] as a uint8 array."""
    return images.mul(255.0).round_().clamp_(0, 255).to(torch.uint8).numpy()


# ----------------------------------------------------------------------------- image datasets


def _train_val(make: Callable[[Callable], Dataset], data_config, seed, val_fraction) -> tuple[Dataset, Dataset]:
    """The seeded train/val split of a train set, each half with its own transform."""
    train_set = make(transforms.per_image(data_config, train=True))
    eval_set = make(transforms.per_image(data_config, train=False))
    train_idx, val_idx = split_indices(len(train_set), val_fraction, seed)
    return Subset(train_set, train_idx.tolist()), Subset(eval_set, val_idx.tolist())


def _torchvision_cifar(name: str, cls_name: str) -> Loader:
    def load(data_config, root, download, seed, val_fraction) -> InMemory:
        import torchvision.datasets as tvd

        cls = getattr(tvd, cls_name)
        with download_lock(root, name, download), _friendly_data_errors(name, root, download):
            train, test = (cls(str(root), train=flag, download=download) for flag in (True, False))
        images = np.concatenate([train.data, test.data]).transpose(0, 3, 1, 2)
        labels = np.asarray(list(train.targets) + list(test.targets), dtype=np.int64)
        return InMemory(np.ascontiguousarray(images), labels, test_indices=np.arange(len(train.data), len(labels)))

    load.__doc__ = f"torchvision {cls_name} in data_dir (download=True fetches it), held uint8 32x32 in memory."
    return load


def _torchvision(name: str, cls_name: str, train_kw: dict, test_kw: dict, classes: int) -> Loader:
    def load(data_config, root, download, seed, val_fraction, image_cache=0) -> Splits:
        import torchvision.datasets as tvd

        cls = getattr(tvd, cls_name)
        with download_lock(root, name, download), _friendly_data_errors(name, root, download):
            source = lambda kw: lambda tf=None: cls(str(root), download=download, transform=tf, **kw)
            make_train = _cached(source(train_kw), f"{name}-{train_kw['split']}", image_cache)
            make_test = _cached(source(test_kw), f"{name}-{test_kw['split']}", image_cache)
            train, val = _train_val(make_train, data_config, seed, val_fraction)
            test = make_test(transforms.per_image(data_config, False))
        return Splits(train, val, test, classes)

    load.__doc__ = f"torchvision {cls_name} in data_dir (download=True fetches it)."
    return load


def _cached(make: Callable[..., Dataset], key: str, image_cache: int) -> Callable[[Callable], Dataset]:
    """``make(transform)`` itself, or with ``image_cache`` > 0 a maker of the same items read from the image cache
    of ``make()`` (the images untransformed), built first when missing."""
    if not image_cache:
        return make
    from vitplast_tune.data import image_cache as cache

    directory = cache.ensure(make, key, image_cache)
    return lambda transform: cache.CachedImages(directory, transform)


register_dataset("cifar10", 10)(_torchvision_cifar("cifar10", "CIFAR10"))
register_dataset("cifar100", 100)(_torchvision_cifar("cifar100", "CIFAR100"))
register_dataset("pets", 37, from_files=True)(
    _torchvision("pets", "OxfordIIITPet", {"split": "trainval"}, {"split": "test"}, 37)
)
register_dataset("flowers102", 102, from_files=True)(
    _torchvision("flowers102", "Flowers102", {"split": "train"}, {"split": "test"}, 102)
)


_IMAGEFOLDER_HELP = (
    "image folder {train_dir} does not exist; point --data-dir at a directory with "
    "train/<class>/<images> (and optionally test/<class>/<images>)"
)


def imagefolder_classes(root: Path) -> list[str]:
    """The class names of ``root/train`` (sorted, as ImageFolder indexes them); a ``root/test`` must have the same."""
    train_dir, test_dir = root / "train", root / "test"
    if not train_dir.is_dir():
        raise UserError(_IMAGEFOLDER_HELP.format(train_dir=train_dir))
    classes = sorted(d.name for d in train_dir.iterdir() if d.is_dir())
    if test_dir.is_dir():
        test = {d.name for d in test_dir.iterdir() if d.is_dir()}
        missing, extra = sorted(set(classes) - test), sorted(test - set(classes))
        if missing or extra:
            found = (("missing", missing), ("extra", extra))
            problem = "; ".join(f"{what} {', '.join(names)}" for what, names in found if names)
            raise UserError(
                f"the test folder {test_dir} must have the classes of {train_dir} ({problem}); "
                "add or remove class folders so both match, or remove test/ to split one off train"
            )
    return classes


@register_dataset("imagefolder", from_files=True)
def _imagefolder(data_config, root, download, seed, val_fraction, image_cache=0) -> Splits:
    """``root/train/<class>/*`` (and ``root/test/<class>/*``, else a seeded 20% test split)."""
    from torchvision.datasets import ImageFolder

    train_dir, test_dir = root / "train", root / "test"
    classes = imagefolder_classes(root)  # test/ has train's classes, so both index them alike (sorted names)
    make = _cached(lambda tf=None: ImageFolder(str(train_dir), transform=tf), "imagefolder-train", image_cache)
    if test_dir.is_dir():
        if ImageFolder(str(test_dir)).class_to_idx != {name: i for i, name in enumerate(classes)}:  # an empty class
            raise UserError(f"the test folder {test_dir} has no images for some classes of {train_dir}; add them")
        train, val = _train_val(make, data_config, seed, val_fraction)
        make_test = lambda tf=None: ImageFolder(str(test_dir), transform=tf)
        test = _cached(make_test, "imagefolder-test", image_cache)(transforms.per_image(data_config, False))
    else:
        full_train, full_eval = (
            make(transforms.per_image(data_config, True)),
            make(transforms.per_image(data_config, False)),
        )
        train_idx, val_idx, test_idx = three_way_split(len(full_train), val_fraction, seed)
        train, val = Subset(full_train, train_idx.tolist()), Subset(full_eval, val_idx.tolist())
        test = Subset(full_eval, test_idx.tolist())
    return Splits(train, val, test, len(classes))


@register_dataset("cifar10c", num_classes=10)
def _cifar10c(data_config, root, download, seed, val_fraction, option: str = "", severity: int = 5) -> InMemory:
    """CIFAR-10-C ``<corruption>.npy`` + ``labels.npy`` (severity 5) from ``data_dir`` or ``data_dir/CIFAR-10-C``.

    CIFAR-10-C has no train split: its 10,000 images of one severity are split 80/20 into
    train and test (seeded, fixed), then train into train/validation.
    """
    folder = next((d for d in (root / "CIFAR-10-C", root) if (d / f"{option}.npy").is_file()), None)
    if folder is None or not (folder / "labels.npy").is_file():
        raise UserError(
            f"CIFAR-10-C files not found: put {option}.npy and labels.npy (from "
            f"https://zenodo.org/records/2535967) in {root / 'CIFAR-10-C'}; they are not downloaded"
        )
    images = np.load(folder / f"{option}.npy", mmap_mode="r")
    labels = np.load(folder / "labels.npy")
    per = len(images) // 5
    block = slice((severity - 1) * per, severity * per)
    images = np.ascontiguousarray(np.asarray(images[block]).transpose(0, 3, 1, 2))
    return InMemory(images, labels[block].astype(np.int64))


def download_lock(root: Path, name: str, download: bool):
    """With ``download``, a file lock per dataset and data directory: trials sharing a node do not race the same
    download (the first downloads, the others wait, then find the files); without, nothing."""
    if not download:
        return contextlib.nullcontext()
    from filelock import FileLock

    root.mkdir(parents=True, exist_ok=True)
    return FileLock(str(root / f".{name}.download.lock"))


class _friendly_data_errors:
    """Turn torchvision's missing-data and download failures into one UserError line."""

    def __init__(self, name: str, root: Path, download: bool):
        self.name, self.root, self.download = name, root, download

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            return False
        if isinstance(exc, (urllib.error.URLError, OSError, ConnectionError)) and self.download:
            raise UserError(
                f'downloading dataset "{self.name}" to {self.root} failed ({exc}); with no network, '
                "download it elsewhere and point --data-dir at it"
            ) from exc
        if isinstance(exc, RuntimeError) and not self.download:
            raise UserError(
                f'dataset "{self.name}" not found in {self.root}; pass --download to fetch it, '
                "or --data-dir to where it lies"
            ) from exc
        return False
