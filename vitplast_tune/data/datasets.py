"""Name datasets in a registry, and load their splits with a model's transforms.

docs/guide/models-and-data.md lists the names. A name with one of timm's prefixes (``torch/``, ``hfds/``) goes to
``timm.data.create_dataset``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitplast_tune.config import default_data_dir
from vitplast_tune.data import generated, image_files, transforms
from vitplast_tune.data.decoded import InMemory
from vitplast_tune.data.splits import Splits, _split_in_memory
from vitplast_tune.errors import DataError, OptionsError, did_you_mean, option

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
_MADE_HERE: set[str] = set()  # shipped or generated into the cache: no data folder is read, nothing downloaded


def register_dataset(
    name: str,
    num_classes: int | None = None,
    from_files: bool = False,
    augment: str = transforms.DEFAULT_AUGMENTATION,
    options: tuple[str, ...] = (),
    made_here: bool = False,
) -> Callable[[Loader], Loader]:
    """Make a decorator that registers a dataset loader under ``name``.

    The loader takes ``(data_config, root, download, seed, val_fraction)`` and returns ``Splits``, or ``InMemory`` for a
    small dataset decoded once.

    Args:
        name: The dataset's name, or its family's for a name with options.
        num_classes: The class count, known before the data loads (None: read from disk).
        from_files: Whether the loader reads image files lazily; it then also takes ``image_cache`` and ``augment``.
        augment: The dataset's default training augmentation.
        options: The options of a family named ``<name>:<option>``, passed to the loader as ``option``.
        made_here: Whether the data is shipped or generated here, reading no ``data_dir``.

    Returns:
        The decorator, which registers the loader and returns it unchanged.

    Raises:
        UserError: ``augment`` is not a known recipe.
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
        if made_here:
            _MADE_HERE.add(name)
        return fn

    return add


def resolve_augmentation(name: str, augment: str | None) -> str:
    """Name the training augmentation a run of dataset ``name`` uses: ``augment``, else the dataset's default."""
    if augment is None or augment == "auto":
        check_dataset_name(name)  # timm's datasets are natural images: the paper's recipe
        return transforms.DEFAULT_AUGMENTATION if image_files._is_timm_name(name) else _AUGMENT[name.partition(":")[0]]
    return transforms.augmentation(augment).name


def num_classes(name: str, data_dir: str | Path | None = None, download: bool = False) -> int:
    """Count a dataset's classes without loading its images.

    Args:
        name: The dataset's name.
        data_dir: The data's root (None: the default data directory).
        download: Whether a timm dataset may be downloaded to read its index.

    Returns:
        The number of classes.

    Raises:
        UserError: The dataset is unknown.
    """
    check_dataset_name(name)
    if image_files._is_timm_name(name):
        return image_files._timm_num_classes(name, _root(data_dir), download)
    family = name.partition(":")[0]
    if family in _NUM_CLASSES:
        return _NUM_CLASSES[family]
    return len(image_files.imagefolder_classes(_root(data_dir)))


def check_applies(
    names: str | tuple[str, ...], data_dir: str | Path | None, download: bool, image_cache: int = 0
) -> None:
    """Refuse a data folder, download or image cache that no dataset of ``names`` would use; OptionsError names it."""
    names = (names,) if isinstance(names, str) else names
    said = " and ".join(f'"{n}"' for n in names)
    if all(n.partition(":")[0] in _MADE_HERE for n in names):
        for key, given in (("data_dir", data_dir is not None), ("download", download)):
            if given:
                raise OptionsError(
                    f"{option(key)} does not apply to dataset {said}, shipped or generated here and read from no "
                    f"folder; leave {option(key)} out, or name a dataset read from files (cifar10, pets, imagefolder, ...)"
                )
    if image_cache > 0 and not any(n.partition(":")[0] in _FROM_FILES or image_files._is_timm_name(n) for n in names):
        raise OptionsError(
            f"image_cache {image_cache} does not apply to dataset {said}, held decoded in memory (the image cache is "
            f"for datasets of image files: {', '.join(sorted(_FROM_FILES))}); set it to 0"
        )


def list_datasets() -> list[str]:
    """List the registered dataset names, sorted.

    Returns:
        The names; families such as ``cifar10c`` take ``:<corruption>``.
    """
    return sorted(_DATASETS)


def check_dataset_name(name: str) -> None:
    """Raise UserError unless ``name`` is a registered dataset, with its option where it takes one, or a timm name."""
    if image_files._is_timm_name(name):
        return
    family, _, option = name.partition(":")
    if family not in _DATASETS:
        raise DataError(
            f'unknown dataset "{name}"{did_you_mean(family, _DATASETS)}; known: {", ".join(list_datasets())}, '
            "or a timm.data.create_dataset name such as torch/cifar10, torch/folder or hfds/<name>"
        )
    if family in _OPTIONS and option not in _OPTIONS[family]:
        raise DataError(
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
    """Load a dataset's splits with the transforms of a model's data config.

    Args:
        name: The dataset's name.
        data_config: The model's timm data config.
        data_dir: The data's root (None: the default data directory).
        download: Whether missing data may be downloaded.
        seed: The seed of the train/validation split.
        val_fraction: The fraction of the train set held out for validation.
        decoded: The same dataset from ``decode_dataset``, not decoded again.
        image_cache: Above 0, read JPEGs from a one-time decode resized to this shorter side.
        augment: The training augmentation (None: the dataset's default).

    Returns:
        The train, validation and test datasets.

    Raises:
        UserError: The dataset is unknown, its data is missing and ``download`` is off, or a download fails.
    """
    augment = resolve_augmentation(name, augment)
    fits = decoded is not None and decoded.name == name
    loaded = decoded if fits else _load(name, data_config, data_dir, download, seed, val_fraction, image_cache, augment)
    if isinstance(loaded, InMemory):
        return _split_in_memory(loaded, seed, val_fraction, data_config, augment)
    return loaded


def decode_dataset(
    name: str,
    data_config: dict[str, Any],
    *,
    data_dir: str | Path | None = None,
    download: bool = False,
    image_cache: int = 0,
) -> InMemory | None:
    """Decode a small dataset once as uint8 images at native resolution; None for a dataset read lazily from disk."""

    loaded = _load(name, data_config, data_dir, download, 0, 0.2, image_cache)
    return loaded if isinstance(loaded, InMemory) else None


def _load(
    name, data_config, data_dir, download, seed, val_fraction, image_cache=0, augment="paper"
) -> Splits | InMemory:
    check_dataset_name(name)
    if image_files._is_timm_name(name):
        return image_files._timm_dataset(
            name, data_config, _root(data_dir), download, seed, val_fraction, image_cache, augment
        )
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


@register_dataset("digits", num_classes=10, augment="light", made_here=True)
def _digits(data_config, root, download, seed, val_fraction) -> InMemory:
    """Load scikit-learn's 1,797 8x8 digits, shipped with it, as one channel."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    return InMemory(images, bunch.target.astype(np.int64))


@register_dataset("fractals", num_classes=64, augment="light", made_here=True)
def _fractals(data_config, root, download, seed, val_fraction) -> InMemory:
    """Render the fractals at the model's resolution, as uint8."""
    from vitplast_tune.data.fractals import fractal_dataset

    images, labels = fractal_dataset(image_size=data_config["input_size"][-1])
    return InMemory(_to_uint8(images), labels.numpy().astype(np.int64))


@register_dataset("digits_c", num_classes=10, augment="light", options=generated.CORRUPTIONS, made_here=True)
def _digits_c(data_config, root, download, seed, val_fraction, option: str = "") -> InMemory:
    """Load digits at 32 px under a CIFAR-10-C corruption, generated once into the cache."""
    return generated.digits_c(option)


@register_dataset("fractals_novel", num_classes=generated.NOVEL_CLASSES, augment="light", made_here=True)
def _fractals_novel(data_config, root, download, seed, val_fraction) -> InMemory:
    """Load fractal classes the testbed never saw, generated once into the cache."""
    return generated.fractals_novel()


@register_dataset(
    "fractals_novel_c",
    num_classes=generated.NOVEL_CLASSES,
    augment="light",
    options=generated.CORRUPTIONS,
    made_here=True,
)
def _fractals_novel_c(data_config, root, download, seed, val_fraction, option: str = "") -> InMemory:
    """Load ``fractals_novel`` under a CIFAR-10-C corruption, generated once into the cache."""
    return generated.fractals_novel_c(option)


def _to_uint8(images: torch.Tensor) -> np.ndarray:
    """Return float images in [0, 1] as a uint8 array."""
    return images.mul(255.0).round_().clamp_(0, 255).to(torch.uint8).numpy()


# ----------------------------------------------------------------------------- image datasets


def _torchvision_cifar(name: str, cls_name: str) -> Loader:
    def load(data_config, root, download, seed, val_fraction) -> InMemory:
        import torchvision.datasets as tvd

        cls = getattr(tvd, cls_name)
        with image_files.download_lock(root, name, download), image_files.friendly_data_errors(name, root, download):
            train, test = (cls(str(root), train=flag, download=download) for flag in (True, False))
        images = np.concatenate([train.data, test.data]).transpose(0, 3, 1, 2)
        labels = np.asarray(list(train.targets) + list(test.targets), dtype=np.int64)
        return InMemory(np.ascontiguousarray(images), labels, test_indices=np.arange(len(train.data), len(labels)))

    load.__doc__ = f"torchvision {cls_name} in data_dir (download=True fetches it), held uint8 32x32 in memory."
    return load


register_dataset("cifar10", 10)(_torchvision_cifar("cifar10", "CIFAR10"))
register_dataset("cifar100", 100)(_torchvision_cifar("cifar100", "CIFAR100"))
register_dataset("pets", 37, from_files=True)(
    image_files._torchvision_loader("pets", "OxfordIIITPet", {"split": "trainval"}, {"split": "test"}, 37)
)
register_dataset("flowers102", 102, from_files=True)(
    image_files._torchvision_loader("flowers102", "Flowers102", {"split": "train"}, {"split": "test"}, 102)
)
register_dataset("imagefolder", from_files=True)(image_files._imagefolder)


@register_dataset("cifar10c", num_classes=10, options=CIFAR10C_CORRUPTIONS)
def _cifar10c(data_config, root, download, seed, val_fraction, option: str = "") -> InMemory:
    """Load CIFAR-10-C at severity 5 from ``data_dir``, its 10,000 images split 80/20 into train and test."""
    folder = next((d for d in (root / "CIFAR-10-C", root) if (d / f"{option}.npy").is_file()), None)
    if folder is None or not (folder / "labels.npy").is_file():
        raise DataError(
            f"CIFAR-10-C files not found: put {option}.npy and labels.npy (from "
            f"https://zenodo.org/records/2535967) in {root / 'CIFAR-10-C'}; they are not downloaded"
        )
    images = np.load(folder / f"{option}.npy", mmap_mode="r")
    labels = np.load(folder / "labels.npy")
    per = len(images) // 5
    block = slice(4 * per, 5 * per)  # severity 5, the last fifth
    images = np.ascontiguousarray(np.asarray(images[block]).transpose(0, 3, 1, 2))
    return InMemory(images, labels[block].astype(np.int64))
