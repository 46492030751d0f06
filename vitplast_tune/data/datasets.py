"""Datasets, their train/validation/test splits, transforms, and seeded batch streams.

A registry maps a dataset name to a loader. Every loader returns ``Splits``: a seeded 80/20
train/validation split of the train set (as in the paper) and the test split for the final
evaluation. Transforms follow the model's own timm data config (resolution, mean/std,
interpolation, crop); training adds the dataset's augmentation recipe (transforms.py): the paper's
RandomResizedCrop + horizontal flip for natural images, a light crop for digits and fractals, unless
``augment`` names another.

Names: ``digits`` (scikit-learn's digits, offline, the default), ``fractals`` (the generated
pretraining / plasticity-reference distribution, offline), ``cifar10``, ``cifar100``, ``pets``,
``flowers102`` (torchvision, ``download=True`` fetches them), ``cifar10c:<corruption>`` (the
published .npy files in ``data_dir``), ``digits_c:<corruption>``, ``fractals_novel`` and ``fractals_novel_c:<corruption>``
(generated offline into the cache, ``generated.py``), and ``imagefolder`` (``data_dir`` with ``train/`` and
optionally ``test/`` class folders; DomainNet fits this shape).

A name the registry does not know, with one of timm's prefixes (``torch/cifar10``, ``torch/folder``,
``hfds/<Hugging Face dataset>``), falls back to ``timm.data.create_dataset`` with ``data_dir`` as its root: the
``train`` split, and ``test`` (else ``validation``) as the test split, or a seeded test split of train when there is
none. Such data is not downloaded unless ``download`` is on; a failure is one UserError line.
"""

from __future__ import annotations

import contextlib
import io
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from vitplast_tune.config import default_data_dir  # re-exported: data.default_data_dir
from vitplast_tune.data import generated, transforms
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
_FROM_FILES: set[str] = set()  # loaders that read image files lazily, and take ``image_cache`` and ``augment``
_AUGMENT: dict[str, str] = {}  # each dataset's default training augmentation (transforms.AUGMENTATIONS)
_OPTIONS: dict[str, tuple[str, ...]] = {}  # families named with ":<option>" (a corruption) and the options they take


def register_dataset(
    name: str,
    num_classes: int | None = None,
    from_files: bool = False,
    augment: str = transforms.DEFAULT_AUGMENTATION,
    options: tuple[str, ...] = (),
) -> Callable[[Loader], Loader]:
    """Decorator adding a loader ``fn(data_config, root, download, seed, val_fraction)``.

    A loader returns ``Splits``, or ``InMemory`` for a small dataset that is decoded once.

    ``num_classes`` lets a model get its head before the data is loaded (None: read from disk).
    ``from_files``: the loader reads image files lazily and also takes ``image_cache`` (see image_cache.py) and
    ``augment`` (the recipe of its training transform). ``augment``: the dataset's default training augmentation
    (a name in ``transforms.AUGMENTATIONS``), used when a run leaves ``FinetuneConfig.augment`` unset. ``options``: the
    family is named ``<name>:<option>`` with one of them (a corruption), passed to the loader as ``option``.
    """
    transforms.augmentation(augment)

    def add(fn: Loader) -> Loader:
        _DATASETS[name] = fn
        _AUGMENT[name] = augment
        if num_classes is not None:
            _NUM_CLASSES[name] = num_classes
        if from_files:
            _FROM_FILES.add(name)
        if options:
            _OPTIONS[name] = tuple(options)
        return fn

    return add


def resolve_augmentation(name: str, augment: str | None) -> str:
    """The training augmentation a run of dataset ``name`` uses: ``augment`` when given (checked), else the
    dataset's default; "auto" is the same as None."""
    if augment is None or augment == "auto":
        check_dataset_name(name)  # a timm.data.create_dataset name: natural images, the paper's recipe
        return transforms.DEFAULT_AUGMENTATION if is_timm_name(name) else _AUGMENT[name.partition(":")[0]]
    return transforms.augmentation(augment).name


def num_classes(name: str, data_dir: str | Path | None = None, download: bool = False) -> int:
    """Number of classes of dataset ``name`` without loading its images (a timm name reads its index)."""
    check_dataset_name(name)
    if is_timm_name(name):
        return _timm_num_classes(name, _root(data_dir), download)
    family = name.partition(":")[0]
    if family in _NUM_CLASSES:
        return _NUM_CLASSES[family]
    return len(imagefolder_classes(_root(data_dir)))


def list_datasets() -> list[str]:
    """Registered dataset names (``cifar10c`` takes ``:<corruption>``)."""
    return sorted(_DATASETS)


def check_dataset_name(name: str) -> None:
    """Raise UserError unless ``name`` is a registered dataset (with a valid CIFAR-10-C corruption)."""
    if is_timm_name(name):
        return
    family, _, option = name.partition(":")
    if family not in _DATASETS:
        raise UserError(
            f'unknown dataset "{name}"{did_you_mean(family, _DATASETS)}; known: {", ".join(list_datasets())}, '
            "or a timm.data.create_dataset name such as torch/cifar10, torch/folder or hfds/<name>"
        )
    if family in _OPTIONS and option not in _OPTIONS[family]:
        raise UserError(
            f'dataset "{name}" needs a corruption, e.g. "{family}:snow"; one of {", ".join(_OPTIONS[family])}'
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
    augment: str | None = None,
) -> Splits:
    """Load dataset ``name`` with transforms for ``data_config`` (see ``models.data_config``).

    ``decoded`` (from ``decode_dataset``) skips decoding a small dataset again. ``image_cache`` > 0 reads
    a JPEG dataset from a one-time decode resized to that shorter side (image_cache.py; built when missing).
    ``augment``: the training split's augmentation recipe (None: the dataset's default, ``resolve_augmentation``).
    Raises UserError with what to do when the data is missing and ``download`` is off, or when a download fails.
    """
    augment = resolve_augmentation(name, augment)
    fits = decoded is not None and decoded.name == name
    loaded = decoded if fits else _load(name, data_config, data_dir, download, seed, val_fraction, image_cache, augment)
    if isinstance(loaded, InMemory):
        return split_in_memory(loaded, seed, val_fraction, data_config, augment)
    return loaded


def decode_dataset(
    name: str, data_config: dict[str, Any], *, data_dir=None, download: bool = False, image_cache: int = 0
) -> InMemory | None:
    """Decode a small dataset once, uint8 at native resolution; None for datasets read lazily from disk
    (whose image cache, with ``image_cache`` > 0, is built here when missing)."""
    loaded = _load(name, data_config, data_dir, download, 0, 0.2, image_cache)
    return loaded if isinstance(loaded, InMemory) else None


def _load(
    name, data_config, data_dir, download, seed, val_fraction, image_cache=0, augment="paper"
) -> Splits | InMemory:
    check_dataset_name(name)
    if is_timm_name(name):
        return _timm_dataset(name, data_config, _root(data_dir), download, seed, val_fraction, image_cache, augment)
    family, _, option = name.partition(":")
    kwargs = dict(
        data_config=data_config, root=_root(data_dir), download=download, seed=seed, val_fraction=val_fraction
    )
    if option:
        kwargs["option"] = option
    if family in _FROM_FILES:
        kwargs.update(image_cache=image_cache, augment=augment)
    loaded = _DATASETS[family](**kwargs)
    if isinstance(loaded, InMemory):
        loaded.name, loaded.num_classes = name, _NUM_CLASSES.get(family, 0)
    return loaded


def _root(data_dir: str | Path | None) -> Path:
    return Path(data_dir).expanduser() if data_dir is not None else default_data_dir()


# ----------------------------------------------------------------------------- offline datasets


@register_dataset("digits", num_classes=10, augment="light")
def _digits(data_config, root, download, seed, val_fraction) -> InMemory:
    """scikit-learn's 1,797 8x8 digits (shipped with the package), kept 8x8 and one channel."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    return InMemory(images, bunch.target.astype(np.int64))


@register_dataset("fractals", num_classes=64, augment="light")
def _fractals(data_config, root, download, seed, val_fraction) -> InMemory:
    """Formula-driven IFS fractals (generated, deterministic) rendered at the model's resolution, as uint8."""
    from vitplast_tune.data.fractals import fractal_dataset

    images, labels = fractal_dataset(image_size=data_config["input_size"][-1])
    return InMemory(_to_uint8(images), labels.numpy().astype(np.int64))


@register_dataset("digits_c", num_classes=10, augment="light", options=generated.CORRUPTIONS)
def _digits_c(data_config, root, download, seed, val_fraction, option: str = "") -> InMemory:
    """Digits upscaled to 32 px under a CIFAR-10-C corruption at severity 5, generated once into the cache."""
    return generated.digits_c(option)


@register_dataset("fractals_novel", num_classes=generated.NOVEL_CLASSES, augment="light")
def _fractals_novel(data_config, root, download, seed, val_fraction) -> InMemory:
    """Fractal classes the testbed never saw in pretraining (class seed 1), generated once into the cache."""
    return generated.fractals_novel()


@register_dataset(
    "fractals_novel_c", num_classes=generated.NOVEL_CLASSES, augment="light", options=generated.CORRUPTIONS
)
def _fractals_novel_c(data_config, root, download, seed, val_fraction, option: str = "") -> InMemory:
    """``fractals_novel`` under a CIFAR-10-C corruption at severity 5, generated once into the cache."""
    return generated.fractals_novel_c(option)


def _to_uint8(images: torch.Tensor) -> np.ndarray:
    """Float images in [0, 1] as a uint8 array."""
    return images.mul(255.0).round_().clamp_(0, 255).to(torch.uint8).numpy()


# ----------------------------------------------------------------------------- image datasets


def _train_val(
    make: Callable[[Callable], Dataset], data_config, seed, val_fraction, augment
) -> tuple[Dataset, Dataset]:
    """The seeded train/val split of a train set, each half with its own transform (training: the recipe ``augment``)."""
    train_set = make(transforms.per_image(data_config, True, augment))
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
    def load(data_config, root, download, seed, val_fraction, image_cache=0, augment="paper") -> Splits:
        import torchvision.datasets as tvd

        cls = getattr(tvd, cls_name)
        with download_lock(root, name, download), _friendly_data_errors(name, root, download):
            source = lambda kw: lambda tf=None: cls(str(root), download=download, transform=tf, **kw)
            make_train = _cached(source(train_kw), f"{name}-{train_kw['split']}", image_cache)
            make_test = _cached(source(test_kw), f"{name}-{test_kw['split']}", image_cache)
            train, val = _train_val(make_train, data_config, seed, val_fraction, augment)
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
    if len(classes) < 2:
        raise UserError(
            f"image folder {train_dir} has {len(classes)} class folder(s) ({', '.join(classes) or 'none'}); a classifier "
            "needs at least 2: put each class's images in a folder of its own, train/<class>/<images>"
        )
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
def _imagefolder(data_config, root, download, seed, val_fraction, image_cache=0, augment="paper") -> Splits:
    """``root/train/<class>/*`` (and ``root/test/<class>/*``, else a seeded 20% test split)."""
    from torchvision.datasets import ImageFolder

    train_dir, test_dir = root / "train", root / "test"
    classes = imagefolder_classes(root)  # test/ has train's classes, so both index them alike (sorted names)
    make = _cached(lambda tf=None: ImageFolder(str(train_dir), transform=tf), "imagefolder-train", image_cache)
    if test_dir.is_dir():
        if ImageFolder(str(test_dir)).class_to_idx != {name: i for i, name in enumerate(classes)}:  # an empty class
            raise UserError(f"the test folder {test_dir} has no images for some classes of {train_dir}; add them")
        train, val = _train_val(make, data_config, seed, val_fraction, augment)
        make_test = lambda tf=None: ImageFolder(str(test_dir), transform=tf)
        test = _cached(make_test, "imagefolder-test", image_cache)(transforms.per_image(data_config, False))
    else:
        full_train, full_eval = (
            make(transforms.per_image(data_config, True, augment)),
            make(transforms.per_image(data_config, False)),
        )
        train_idx, val_idx, test_idx = three_way_split(len(full_train), val_fraction, seed)
        train, val = Subset(full_train, train_idx.tolist()), Subset(full_eval, val_idx.tolist())
        test = Subset(full_eval, test_idx.tolist())
    return Splits(train, val, test, len(classes))


# ----------------------------------------------------------------------------- timm's dataset factory, the fallback

TIMM_PREFIXES = ("torch", "hfds")  # timm.data.create_dataset's map-style datasets (torchvision, Hugging Face)
_FOLDER_NAMES = ("folder", "image_folder")  # torch/folder: torchvision's ImageFolder on data_dir's split folders
_EVAL_FOLDERS = ("test", "validation", "val", "valid", "eval", "evaluation")


def is_timm_name(name: str) -> bool:
    """Whether ``name`` goes to ``timm.data.create_dataset``: ``<prefix>/<name>`` with a prefix in TIMM_PREFIXES."""
    prefix, sep, rest = name.partition("/")
    return bool(sep and rest) and prefix.lower() in TIMM_PREFIXES


def _timm_create(name: str, root: Path, split: str, download: bool, transform=None) -> Dataset:
    """``timm.data.create_dataset`` of one split, its images as RGB; any failure (no network, missing files, a
    missing package) one UserError line."""
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
        raise UserError(
            f'dataset "{name}" (timm.data.create_dataset, split {split}, root {root}) could not be loaded: '
            f"{type(exc).__name__}: {first}; {todo}"
        ) from None


def _timm_num_classes(name: str, root: Path, download: bool) -> int:
    """The class count of a timm dataset's train split (torchvision's ``classes``, timm's reader's ``class_to_idx``)."""
    train = _timm_create(name, root, "train", download)
    classes = getattr(train, "classes", None) or getattr(getattr(train, "reader", None), "class_to_idx", None)
    if not classes:
        raise UserError(f'dataset "{name}" names no classes, so a classification head cannot be sized for it')
    return len(classes)


def _timm_eval_split(name: str, root: Path, download: bool) -> str | None:
    """The split a timm dataset is tested on: ``test``, else ``validation`` (for a folder: the first of
    ``_EVAL_FOLDERS`` present in ``root``); None when it has none."""
    if name.partition("/")[2].lower() in _FOLDER_NAMES:
        return next((d for d in _EVAL_FOLDERS if (root / d).is_dir()), None)
    for split in ("test", "validation"):
        with contextlib.suppress(UserError):
            _timm_create(name, root, split, download)
            return split
    return None


def _timm_dataset(name, data_config, root, download, seed, val_fraction, image_cache=0, augment="paper") -> Splits:
    """A dataset by ``timm.data.create_dataset``: its train split divided into train/validation (seeded), its test
    split (``_timm_eval_split``) or else a seeded test split of train; ``image_cache`` and ``augment`` as for image
    folders."""
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
    train_idx, val_idx, test_idx = three_way_split(len(full_train), val_fraction, seed)
    pick = lambda dataset, idx: Subset(dataset, idx.tolist())
    return Splits(pick(full_train, train_idx), pick(full_eval, val_idx), pick(full_eval, test_idx), classes)


@register_dataset("cifar10c", num_classes=10, options=CIFAR10C_CORRUPTIONS)
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
