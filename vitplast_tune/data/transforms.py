"""Transform images to the model's resolution, per image (timm, PIL) or per batch on any device; register recipes.

A recipe (``Augmentation``) says how training images vary. Randomness comes from a seed per batch, so a resumed trial
replays the same batches.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vitplast_tune.errors import UserError, did_you_mean

SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
_GRID_MODES = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "nearest"}


@dataclass(frozen=True)
class Augmentation:
    """A training augmentation recipe: a RandomResizedCrop, then a horizontal flip, then an optional timm policy.

    ``scale`` is the crop's fraction of the area (None: train on the evaluation transform), ``ratio`` its aspect,
    ``hflip`` the flip's probability, and ``auto_augment`` a RandAugment, AutoAugment or AugMix policy.
    """

    name: str
    scale: tuple[float, float] | None
    ratio: tuple[float, float] = RATIO
    hflip: float = 0.0
    about: str = ""
    auto_augment: str | None = None


AUGMENTATIONS: dict[str, Augmentation] = {}
DEFAULT_AUGMENTATION = "paper"  # a dataset's default unless it registers another


def register_augmentation(recipe: Augmentation) -> Augmentation:
    """Add a recipe to the registry under its name.

    Args:
        recipe: The recipe.

    Returns:
        The same recipe.
    """
    AUGMENTATIONS[recipe.name] = recipe
    return recipe


register_augmentation(
    Augmentation("paper", SCALE, RATIO, 0.5, "the paper's, for natural images: RandomResizedCrop 8-100% + flip")
)
register_augmentation(Augmentation("light", (0.8, 1.0), RATIO, 0.0, "RandomResizedCrop 80-100%, no flip"))
register_augmentation(Augmentation("none", None, about="none: the evaluation transform"))


def with_auto_augment(name: str, policy: str | None) -> str:
    """Name recipe ``name`` followed by a timm policy, which ``augmentation`` reads back; ``none`` takes none."""
    if policy is None:
        return name
    if augmentation(name).scale is None:
        raise UserError(f'auto_augment "{policy}" needs a training crop: augment paper or light, not {name}')
    return f"{name}{AUTO_AUGMENT_JOIN}{policy}"


AUTO_AUGMENT_JOIN = "+"  # between a recipe's name and a timm policy (policies are written with - and digits)


def augmentation(name: str) -> Augmentation:
    """Look up a registered recipe by name, optionally followed by a timm policy; UserError for an unknown name."""
    base, join, policy = name.partition(AUTO_AUGMENT_JOIN)
    if join and policy:
        return replace(augmentation(base), name=name, auto_augment=policy)
    if name not in AUGMENTATIONS:
        raise UserError(
            f'unknown augmentation "{name}"{did_you_mean(name, AUGMENTATIONS)}; use one of {", ".join(AUGMENTATIONS)}'
        )
    return AUGMENTATIONS[name]


def _crop_pct(data_config: dict[str, Any]) -> float:
    """Return the config's evaluation crop fraction, timm's default when it has none."""
    from timm.data import DEFAULT_CROP_PCT

    return float(data_config.get("crop_pct") or DEFAULT_CROP_PCT)


def per_image(data_config: dict[str, Any], train: bool, augment: str = DEFAULT_AUGMENTATION) -> Callable:
    """Return timm's transform of one PIL image: the recipe's for training, else resize and center crop."""
    from timm.data import create_transform

    recipe = augmentation(augment)
    crops = train and recipe.scale is not None
    return create_transform(
        data_config["input_size"],
        is_training=crops,
        scale=recipe.scale or SCALE,
        ratio=recipe.ratio,
        hflip=recipe.hflip,
        vflip=0.0,
        color_jitter=None,
        auto_augment=recipe.auto_augment if crops else None,
        interpolation=data_config.get("interpolation", "bilinear"),
        mean=data_config["mean"],
        std=data_config["std"],
        crop_pct=_crop_pct(data_config),
        crop_mode=data_config.get("crop_mode", "center"),
    )


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Run the block with torch's CPU, Python's and numpy's generators seeded, then restore them; None seeds nothing."""
    if seed is None:
        yield
        return
    state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            random.setstate(state)
            np.random.set_state(np_state)


def _batch_seed(seed: int, epoch: int, batch: int, rank: int = 0) -> int:
    """Return the augmentation seed of one batch; the first worker's is the one-worker run's."""
    return int(np.random.SeedSequence([seed, epoch, batch, *([rank] if rank else [])]).generate_state(1)[0])


def _crop_boxes(
    n: int, height: int, width: int, seed: int | None, recipe: Augmentation = AUGMENTATIONS["paper"]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``n`` RandomResizedCrop boxes (top, left, h, w) of the recipe, and ``n`` horizontal flips."""
    from torchvision.transforms import RandomResizedCrop

    shape_only = torch.empty(1, height, width)
    scale, ratio = list(recipe.scale or (1.0, 1.0)), list(recipe.ratio)
    with seeded(seed):
        boxes = torch.tensor([RandomResizedCrop.get_params(shape_only, scale, ratio) for _ in range(n)])
        flips = torch.rand(n) < recipe.hflip
    return boxes.float().reshape(n, 4), flips


def batch_transform(
    images: torch.Tensor,
    data_config: dict[str, Any],
    train: bool,
    seed: int | None = None,
    augment: str = DEFAULT_AUGMENTATION,
) -> torch.Tensor:
    """Turn uint8 images (B, C, h, w) on any device into normalized floats at the model's input size."""
    x = images.float().div_(255.0)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    recipe = augmentation(augment)
    if train and recipe.scale is not None:
        x = _crop_flip(x, data_config, seed, recipe)
    else:
        x = _resize_center_crop(x, data_config)
    mean, std = _mean_std(tuple(data_config["mean"]), tuple(data_config["std"]), x.device, x.dtype)
    return x.clamp_(0.0, 1.0).sub_(mean).div_(std)  # torchvision's normalize, without its two copies to the GPU a call


@functools.lru_cache(maxsize=16)
def _mean_std(mean: tuple, std: tuple, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the normalization's mean and std as (1, C, 1, 1) tensors on ``device``, made once."""
    made = lambda values: torch.tensor(values, dtype=dtype).view(1, -1, 1, 1).to(device)
    return made(mean), made(std)


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move a host tensor to ``device``, by way of pinned memory to a GPU so that the copy does not wait."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def _crop_flip(x: torch.Tensor, data_config: dict[str, Any], seed: int | None, recipe: Augmentation) -> torch.Tensor:
    """Resize each image's own crop box to the input size, flipped or not, in one affine grid_sample."""
    n, _, height, width = x.shape
    _, out_h, out_w = data_config["input_size"]
    boxes, flips = _crop_boxes(n, height, width, seed, recipe)
    top, left, h, w = boxes.unbind(1)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = torch.where(flips, -w / width, w / width)
    theta[:, 0, 2] = (2 * left + w) / width - 1
    theta[:, 1, 1] = h / height
    theta[:, 1, 2] = (2 * top + h) / height - 1
    grid = F.affine_grid(_to(theta, x.device), [n, 3, out_h, out_w], align_corners=False)
    mode = _GRID_MODES.get(data_config.get("interpolation", "bilinear"), "bilinear")
    return F.grid_sample(x, grid, mode=mode, padding_mode="border", align_corners=False)


def _resize_center_crop(x: torch.Tensor, data_config: dict[str, Any]) -> torch.Tensor:
    """Resize a batch to input / crop_pct and center crop it, as timm evaluates."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    _, out_h, out_w = data_config["input_size"]
    scale = math.floor(max(out_h, out_w) / _crop_pct(data_config))
    squash = data_config.get("crop_mode", "center") == "squash"
    size = [scale, scale] if squash else [scale]
    interpolation = InterpolationMode(_GRID_MODES.get(data_config.get("interpolation", "bilinear"), "bilinear"))
    x = TF.resize(x, size, interpolation=interpolation, antialias=True)
    return TF.center_crop(x, [out_h, out_w])


def prepare_images(images: torch.Tensor, data_config: dict[str, Any]) -> torch.Tensor:
    """Resize float images (N, C, h, w) in [0, 1] to the model's input size, and normalize them."""

    _, height, width = data_config["input_size"]
    images = images.float()
    if images.shape[1] == 1:
        images = images.expand(-1, 3, -1, -1)
    if images.shape[-2:] != (height, width):
        mode = "bicubic" if data_config.get("interpolation") == "bicubic" else "bilinear"
        images = F.interpolate(images, size=(height, width), mode=mode, align_corners=False).clamp(0, 1)
    mean = torch.tensor(data_config["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(data_config["std"]).view(1, 3, 1, 1)
    return ((images - mean) / std).contiguous()
