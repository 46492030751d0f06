"""Read datasets lazily from image files: Pets, Flowers102, image folders and timm's dataset factory."""

from __future__ import annotations

import contextlib
import io
import urllib.error
from collections.abc import Callable
from pathlib import Path

from torch.utils.data import Dataset, Subset

from vitplast_tune.data import transforms
from vitplast_tune.data.splits import Splits, _three_way_split, split_indices
from vitplast_tune.errors import DataError, UserError


def _train_val(
    make: Callable[[Callable], Dataset], data_config, seed, val_fraction, augment
) -> tuple[Dataset, Dataset]:
    """Split a train set seeded into train and validation, each half with its own transform."""
    train_set = make(transforms.per_image(data_config, True, augment))
    eval_set = make(transforms.per_image(data_config, train=False))
    train_idx, val_idx = split_indices(len(train_set), val_fraction, seed)
    return Subset(train_set, train_idx.tolist()), Subset(eval_set, val_idx.tolist())


def _torchvision_loader(name: str, cls_name: str, train_kw: dict, test_kw: dict, classes: int) -> Callable[..., Splits]:
    def load(data_config, root, download, seed, val_fraction, image_cache=0, augment="paper") -> Splits:
        import torchvision.datasets as tvd

        cls = getattr(tvd, cls_name)
        with download_lock(root, name, download), friendly_data_errors(name, root, download):
            source = lambda kw: lambda tf=None: cls(str(root), download=download, transform=tf, **kw)
            make_train = _cached(source(train_kw), f"{name}-{train_kw['split']}", image_cache)
            make_test = _cached(source(test_kw), f"{name}-{test_kw['split']}", image_cache)
            train, val = _train_val(make_train, data_config, seed, val_fraction, augment)
            test = make_test(transforms.per_image(data_config, False))
        return Splits(train, val, test, classes)

    load.__doc__ = f"torchvision {cls_name} in data_dir (download=True fetches it)."
    return load


def _cached(make: Callable[..., Dataset], key: str, image_cache: int) -> Callable[[Callable], Dataset]:
    """Return ``make`` itself, or with ``image_cache`` a maker of the same items read from the image cache."""
    if not image_cache:
        return make
    from vitplast_tune.data import image_cache as cache

    directory = cache.ensure(make, key, image_cache)
    return lambda transform: cache.CachedImages(directory, transform)


def imagefolder_classes(root: Path) -> list[str]:
    """Return the class folders of ``root/train``, sorted; a ``root/test`` must have the same."""
    train_dir, test_dir = root / "train", root / "test"
    if not train_dir.is_dir():
        raise DataError(
            f"image folder {train_dir} does not exist; point --data-dir at a directory with "
            "train/<class>/<images> (and optionally test/<class>/<images>)"
        )
    classes = sorted(d.name for d in train_dir.iterdir() if d.is_dir())
    if len(classes) < 2:
        raise DataError(
            f"image folder {train_dir} has {len(classes)} class folder(s) ({', '.join(classes) or 'none'}); a classifier "
            "needs at least 2: put each class's images in a folder of its own, train/<class>/<images>"
        )
    if test_dir.is_dir():
        test = {d.name for d in test_dir.iterdir() if d.is_dir()}
        missing, extra = sorted(set(classes) - test), sorted(test - set(classes))
        if missing or extra:
            found = (("missing", missing), ("extra", extra))
            problem = "; ".join(f"{what} {', '.join(names)}" for what, names in found if names)
            raise DataError(
                f"the test folder {test_dir} must have the classes of {train_dir} ({problem}); "
                "add or remove class folders so both match, or remove test/ to split one off train"
            )
    return classes


def _imagefolder(data_config, root, download, seed, val_fraction, image_cache=0, augment="paper") -> Splits:
    """Load ``root/train/<class>/*`` and ``root/test/<class>/*``, else a seeded 20% test split of train."""
    from torchvision.datasets import ImageFolder

    train_dir, test_dir = root / "train", root / "test"
    classes = imagefolder_classes(root)  # test/ has train's classes, so both index them alike
    make = _cached(lambda tf=None: ImageFolder(str(train_dir), transform=tf), "imagefolder-train", image_cache)
    if test_dir.is_dir():
        if ImageFolder(str(test_dir)).class_to_idx != {name: i for i, name in enumerate(classes)}:  # an empty class
            raise DataError(f"the test folder {test_dir} has no images for some classes of {train_dir}; add them")
        train, val = _train_val(make, data_config, seed, val_fraction, augment)
        make_test = lambda tf=None: ImageFolder(str(test_dir), transform=tf)
        test = _cached(make_test, "imagefolder-test", image_cache)(transforms.per_image(data_config, False))
    else:
        full_train, full_eval = (
            make(transforms.per_image(data_config, True, augment)),
            make(transforms.per_image(data_config, False)),
        )
        train_idx, val_idx, test_idx = _three_way_split(len(full_train), val_fraction, seed)
        train, val = Subset(full_train, train_idx.tolist()), Subset(full_eval, val_idx.tolist())
        test = Subset(full_eval, test_idx.tolist())
    return Splits(train, val, test, len(classes))


TIMM_PREFIXES = ("torch", "hfds")  # timm.data.create_dataset's map-style datasets (torchvision, Hugging Face)
_FOLDER_NAMES = ("folder", "image_folder")  # torch/folder: torchvision's ImageFolder on data_dir's split folders
_EVAL_FOLDERS = ("test", "validation", "val", "valid", "eval", "evaluation")


def _is_timm_name(name: str) -> bool:
    """Return whether ``name`` goes to ``timm.data.create_dataset``: a prefix in TIMM_PREFIXES and a name."""
    prefix, sep, rest = name.partition("/")
    return bool(sep and rest) and prefix.lower() in TIMM_PREFIXES


def _timm_create(name: str, root: Path, split: str, download: bool, transform=None) -> Dataset:
    """Create one split by ``timm.data.create_dataset``, its images as RGB; any failure is one UserError line."""
    from timm.data import create_dataset

    rgb = None if transform is None else lambda image: transform(image.convert("RGB"))
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # timm prints install hints of its own
            return create_dataset(name, root=str(root), split=split, download=download, transform=rgb)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        if isinstance(exc, ImportError):
            todo = f"install the package it needs (pip install {exc.name or 'the missing module'})"
        elif download:
            todo = "with no network, fetch it elsewhere and point --data-dir at it"
        else:
            todo = "pass --download to fetch it (needs a network), or --data-dir to where it lies"
        raise DataError(
            f'dataset "{name}" (timm.data.create_dataset, split {split}, root {root}) could not be loaded: '
            f"{type(exc).__name__}: {first}; {todo}"
        ) from None


def _timm_num_classes(name: str, root: Path, download: bool) -> int:
    """Count the classes of a timm dataset's train split."""
    train = _timm_create(name, root, "train", download)
    classes = getattr(train, "classes", None) or getattr(getattr(train, "reader", None), "class_to_idx", None)
    if not classes:
        raise DataError(f'dataset "{name}" names no classes, so a classification head cannot be sized for it')
    return len(classes)


def _timm_eval_split(name: str, root: Path, download: bool) -> str | None:
    """Return the split a timm dataset is tested on, ``test`` or else ``validation``; None when it has none."""
    if name.partition("/")[2].lower() in _FOLDER_NAMES:
        return next((d for d in _EVAL_FOLDERS if (root / d).is_dir()), None)
    for split in ("test", "validation"):
        with contextlib.suppress(UserError):
            _timm_create(name, root, split, download)
            return split
    return None


def _timm_dataset(name, data_config, root, download, seed, val_fraction, image_cache=0, augment="paper") -> Splits:
    """Load a dataset by ``timm.data.create_dataset``: its train split divided seeded, and its test split."""
    classes = _timm_num_classes(name, root, download)
    key = f"timm-{name}"
    make = lambda split: _cached(
        lambda tf=None: _timm_create(name, root, split, download, tf), f"{key}-{split}", image_cache
    )
    eval_split = _timm_eval_split(name, root, download)
    if eval_split is not None:
        train, val = _train_val(make("train"), data_config, seed, val_fraction, augment)
        test = make(eval_split)(transforms.per_image(data_config, False))
        return Splits(train, val, test, classes)
    full_train = make("train")(transforms.per_image(data_config, True, augment))
    full_eval = make("train")(transforms.per_image(data_config, False))
    train_idx, val_idx, test_idx = _three_way_split(len(full_train), val_fraction, seed)
    pick = lambda dataset, idx: Subset(dataset, idx.tolist())
    return Splits(pick(full_train, train_idx), pick(full_eval, val_idx), pick(full_eval, test_idx), classes)


def download_lock(root: Path, name: str, download: bool):
    """Return a file lock per dataset and folder when downloading, so that trials on a node download once."""
    if not download:
        return contextlib.nullcontext()
    from filelock import FileLock

    root.mkdir(parents=True, exist_ok=True)
    return FileLock(str(root / f".{name}.download.lock"))


class friendly_data_errors:
    """Turn torchvision's missing-data and download failures into one UserError line."""

    def __init__(self, name: str, root: Path, download: bool):
        self.name, self.root, self.download = name, root, download

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            return False
        if isinstance(exc, (urllib.error.URLError, OSError, ConnectionError)) and self.download:
            raise DataError(
                f'downloading dataset "{self.name}" to {self.root} failed ({exc}); with no network, '
                "download it elsewhere and point --data-dir at it"
            ) from exc
        if isinstance(exc, RuntimeError) and not self.download:
            raise DataError(
                f'dataset "{self.name}" not found in {self.root}; pass --download to fetch it, '
                "or --data-dir to where it lies"
            ) from exc
        return False
