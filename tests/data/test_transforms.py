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
