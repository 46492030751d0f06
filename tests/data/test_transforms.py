"""The batched device transforms against timm's per-image ones: same geometry, same crop distribution."""

import numpy as np
import pytest
import torch
from PIL import Image

from vitplast_tune.data import transforms

CONFIG = {
    "input_size": (3, 224, 224),
    "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225),
    "interpolation": "bicubic",
    "crop_pct": 0.9,
    "crop_mode": "center",
}


def smooth_images(n: int, height: int = 32, width: int = 48) -> np.ndarray:
    """uint8 (n, 3, height, width) images of smooth gradients (interpolation kernels agree on them)."""
    ys, xs = np.meshgrid(np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij")
    rng = np.random.default_rng(0)
    out = [np.stack([np.sin(3 * a * xs + b * ys + c) for a, b, c in rng.uniform(0.3, 2, (3, 3))]) for _ in range(n)]
    return np.rint((np.stack(out) + 1) * 127.5).astype(np.uint8)


@pytest.mark.parametrize("crop_mode, interpolation", [("center", "bicubic"), ("squash", "bilinear")])
def test_batched_evaluation_matches_the_per_image_path(crop_mode, interpolation):
    config = {**CONFIG, "crop_mode": crop_mode, "interpolation": interpolation}
    images = smooth_images(4)
    per_image = transforms.per_image(config, train=False)
    expected = torch.stack([per_image(Image.fromarray(im.transpose(1, 2, 0))) for im in images])
    batched = transforms.batch_transform(torch.from_numpy(images), config, train=False)
    assert batched.shape == expected.shape == (4, 3, 224, 224)
    difference = (batched - expected).abs() * torch.tensor(config["std"]).view(1, 3, 1, 1) * 255  # in pixel levels
    assert difference.mean() < 1.5 and difference.max() < 12  # PIL's and torch's kernels differ slightly


@pytest.mark.parametrize("train", [False, True])
def test_the_batch_is_normalized_exactly_as_torchvisions_normalize_does_and_the_same_at_every_call(train):
    """The mean and std are made once per device (no copies to the GPU at each batch), with the values torchvision's
    normalize gives, bit for bit."""
    from torchvision.transforms.v2 import functional as TF

    config, images = {**CONFIG, "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}, smooth_images(3)
    unnormalized = {**config, "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}
    raw = transforms.batch_transform(torch.from_numpy(images), unnormalized, train, seed=5)
    expected = TF.normalize(raw, list(config["mean"]), list(config["std"]))
    for _ in range(2):
        assert torch.equal(transforms.batch_transform(torch.from_numpy(images), config, train, seed=5), expected)


def test_batched_training_crops_follow_random_resized_crops_distribution():
    from scipy.stats import ks_2samp
    from torchvision.transforms import RandomResizedCrop

    size = 128
    ys, xs = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")  # pixel coordinates as colours
    ramp = np.stack([xs * 2, ys * 2, np.zeros_like(xs)]).astype(np.uint8)
    config = {**CONFIG, "input_size": (3, 64, 64), "mean": (0, 0, 0), "std": (1, 1, 1), "interpolation": "bilinear"}
    out = transforms.batch_transform(torch.from_numpy(np.repeat(ramp[None], 400, axis=0)), config, True, seed=7)
    x, y = out[:, 0] * 255 / 2, out[:, 1] * 255 / 2  # back to source coordinates
    width = (x[:, :, -1] - x[:, :, 0]).abs().mean(1) * 64 / 63  # pixel-centre span -> crop width
    height = (y[:, -1, :] - y[:, 0, :]).mean(1) * 64 / 63
    torch.manual_seed(0)
    reference = torch.tensor(
        [RandomResizedCrop.get_params(torch.empty(1, size, size), [0.08, 1], [3 / 4, 4 / 3])[2:] for _ in range(4000)]
    ).float()
    area, aspect = width * height / size**2, width / height
    ref_area, ref_aspect = reference[:, 0] * reference[:, 1] / size**2, reference[:, 1] / reference[:, 0]
    assert ks_2samp(area.numpy(), ref_area.numpy()).pvalue > 0.01
    assert ks_2samp(aspect.numpy(), ref_aspect.numpy()).pvalue > 0.01
    flipped = (x[:, :, -1] < x[:, :, 0]).all(1).float().mean()
    assert 0.4 < flipped < 0.6  # horizontal flips with probability 1/2
    again = transforms.batch_transform(torch.from_numpy(np.repeat(ramp[None], 400, axis=0)), config, True, seed=7)
    assert torch.equal(out, again)  # the batch's seed decides its crops


DIGITS_CONFIG = {  # the testbed ViT's data config: 8x8 digits shown at 32 px
    "input_size": (3, 32, 32),
    "mean": (0.5, 0.5, 0.5),
    "std": (0.5, 0.5, 0.5),
    "interpolation": "bilinear",
    "crop_pct": 1.0,
    "crop_mode": "center",
}


def ramp_boxes(recipe: str, n: int = 400, seed: int = 7):
    """Crop width/height (fractions of the image) and whether each image was flipped, read back from a batch of
    coordinate-coded images (red = x, green = y) through the batched training transform of ``recipe``."""
    size = 128
    ys, xs = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    ramp = np.stack([xs * 2, ys * 2, np.zeros_like(xs)]).astype(np.uint8)
    config = {**CONFIG, "input_size": (3, 64, 64), "mean": (0, 0, 0), "std": (1, 1, 1), "interpolation": "bilinear"}
    out = transforms.batch_transform(torch.from_numpy(np.repeat(ramp[None], n, axis=0)), config, True, seed, recipe)
    x, y = out[:, 0] * 255 / 2, out[:, 1] * 255 / 2
    width = (x[:, :, -1] - x[:, :, 0]).abs().mean(1) * 64 / 63 / size
    height = (y[:, -1, :] - y[:, 0, :]).mean(1) * 64 / 63 / size
    return width, height, (x[:, :, -1] < x[:, :, 0]).all(1)


def test_the_light_recipe_crops_little_and_never_flips():
    width, height, flipped = ramp_boxes("light")
    area = width * height
    assert not flipped.any()
    assert area.min() > 0.8 - 0.02 and area.max() <= 1.0 + 0.02  # RandomResizedCrop of 80-100% of the area
    assert area.std() > 0.02  # and it does vary
    width, height, flipped = ramp_boxes("paper")
    assert 0.4 < flipped.float().mean() < 0.6 and (width * height).min() < 0.2  # the paper's recipe, for contrast


def test_none_trains_on_the_evaluation_transform():
    images = torch.from_numpy(smooth_images(4))
    config = {**CONFIG, "input_size": (3, 64, 64)}
    train = transforms.batch_transform(images, config, True, seed=3, augment="none")
    assert torch.equal(train, transforms.batch_transform(images, config, False))


def test_per_image_recipes_are_timms_with_the_recipes_crop_and_flip():
    from timm.data.transforms import RandomResizedCropAndInterpolation
    from torchvision.transforms import RandomHorizontalFlip

    light = transforms.per_image(DIGITS_CONFIG, True, "light").transforms
    crop = next(t for t in light if isinstance(t, RandomResizedCropAndInterpolation))
    assert crop.scale == (0.8, 1.0) and not any(isinstance(t, RandomHorizontalFlip) for t in light)
    paper = transforms.per_image(DIGITS_CONFIG, True, "paper").transforms
    assert any(isinstance(t, RandomHorizontalFlip) and t.p == 0.5 for t in paper)
    none = transforms.per_image(DIGITS_CONFIG, True, "none").transforms
    evaluation = transforms.per_image(DIGITS_CONFIG, False).transforms
    assert [type(t) for t in none] == [type(t) for t in evaluation]


def test_the_digits_default_keeps_the_digit_where_the_papers_recipe_crops_it_away():
    """Each training image against the same digit's evaluation image (Pearson correlation of the pixels)."""
    from sklearn.datasets import load_digits

    from vitplast_tune.data import datasets

    digits = np.rint(load_digits().images[:256] * 255 / 16).astype(np.uint8)[:, None]
    recipe = datasets.resolve_augmentation("digits", None)
    evaluation = transforms.batch_transform(torch.from_numpy(digits), DIGITS_CONFIG, False).flatten(1).numpy()

    def similarity(augment: str) -> float:
        train = transforms.batch_transform(torch.from_numpy(digits), DIGITS_CONFIG, True, 11, augment)
        return np.mean([np.corrcoef(a, b)[0, 1] for a, b in zip(evaluation, train.flatten(1).numpy())])

    assert recipe == "light"
    assert similarity(recipe) > 0.8 and similarity("paper") < 0.6


def test_an_unknown_recipe_is_a_user_error_naming_the_known_ones():
    from vitplast_tune.errors import UserError

    with pytest.raises(UserError, match='unknown augmentation "papr" \\(did you mean "paper"\\?\\); use one of paper'):
        transforms.augmentation("papr")
