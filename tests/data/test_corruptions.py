"""CIFAR-10-C's corruptions at their 32-px parameters (data/corruptions.py) and the offline tasks generated from them
(data/generated.py), checked against what each corruption must do."""

from __future__ import annotations

import numpy as np
import pytest

from vitplast_tune.data import corruptions, datasets, generated
from vitplast_tune.errors import UserError


def images(n: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)


def test_contrast_pulls_each_channel_to_its_mean_by_the_severity_factor():
    x = images(2)
    out = corruptions.corrupt(x, "contrast", 5).astype(float)
    f = x.astype(float) / 255
    mean = f.mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(out, np.round(np.clip((f - mean) * 0.15 + mean, 0, 1) * 255), atol=0)


def test_noise_has_the_severitys_standard_deviation():
    grey = np.full((8, 3, 32, 32), 128, np.uint8)
    gauss = (corruptions.corrupt(grey, "gaussian_noise", 5).astype(float) - 128) / 255
    assert gauss.std() == pytest.approx(0.10, rel=0.05) and abs(gauss.mean()) < 0.01
    speckle = (corruptions.corrupt(grey, "speckle_noise", 5).astype(float) - 128) / 255
    assert speckle.std() == pytest.approx(0.20 * 128 / 255, rel=0.05)  # x * N(0, 0.2) at x = 128/255


def test_motion_blur_is_a_normalised_one_sided_line_kernel():
    x = np.zeros((1, 32, 32))
    x[0, 16, 16] = 1.0
    blurred = corruptions.line_blur(x, radius=9, sigma=2.5, angle=0.0)  # along the rows: the spot trails to the left
    assert blurred.sum() == pytest.approx(1.0) and blurred[0, 16].sum() == pytest.approx(1.0)
    weights = np.exp(-(np.arange(19) ** 2) / (2 * 2.5**2))
    np.testing.assert_allclose(blurred[0, 16, 16::-1][:17], (weights / weights.sum())[:17], atol=1e-12)
    flat = np.ones((3, 32, 32))
    np.testing.assert_allclose(corruptions.line_blur(flat, 9, 2.5, 30.0), flat)  # edges repeat: constant stays


def test_snow_brightens_and_each_image_has_its_own_reproducible_draw():
    x = images(3)
    once, again = corruptions.corrupt(x, "snow", 5, seed=0), corruptions.corrupt(x, "snow", 5, seed=0)
    assert np.array_equal(once, again) and not np.array_equal(once, corruptions.corrupt(x, "snow", 5, seed=1))
    assert once.astype(float).mean() > x.astype(float).mean()
    assert not np.array_equal(once[0], corruptions.corrupt(x[1:2], "snow", 5)[0])  # image 0's draw, not image 1's
    with pytest.raises(ValueError, match="unknown corruption"):
        corruptions.corrupt(x, "frost")


def test_shot_and_impulse_noise_have_the_severitys_amounts():
    grey = np.full((8, 3, 32, 32), 128, np.uint8)
    shot = corruptions.corrupt(grey, "shot_noise", 5).astype(float) / 255 - 128 / 255
    assert shot.std() == pytest.approx(np.sqrt(128 / 255 / 50), rel=0.05) and abs(shot.mean()) < 0.01  # Poisson
    impulse = corruptions.corrupt(grey, "impulse_noise", 5)
    hit = impulse != 128
    assert hit.mean() == pytest.approx(0.14, abs=0.01) and set(np.unique(impulse[hit])) == {0, 255}
    assert (impulse[hit] == 255).mean() == pytest.approx(0.5, abs=0.05)


def test_defocus_pixelate_and_jpeg_keep_a_flat_image_and_change_a_textured_one():
    flat, x = np.full((2, 3, 32, 32), 90, np.uint8), images(2)
    for name in ("defocus_blur", "pixelate", "jpeg_compression"):
        assert np.abs(corruptions.corrupt(flat, name, 5).astype(int) - 90).max() <= 1, name
        out = corruptions.corrupt(x, name, 5)
        assert out.shape == x.shape and not np.array_equal(out, x) and np.array_equal(out, corruptions.corrupt(x, name))
    spot = np.zeros((3, 32, 32))
    spot[:, 16, 16] = 1.0
    blurred = corruptions.defocus_blur(spot, 5, np.random.default_rng(0))  # radius 1.5: the spot spread over 3 x 3
    assert blurred.sum() == pytest.approx(3.0) and (blurred[0] > 1e-3).sum() == 9
    blocks = corruptions.corrupt(x, "pixelate", 5)  # 32 -> 20 -> 32 px: fewer distinct values per row than the image
    assert len(np.unique(blocks[0, 0, 0])) < len(np.unique(x[0, 0, 0]))


def test_fog_adds_one_plasma_cloud_to_every_channel_and_rescales_to_the_brightest_value():
    cloud = corruptions.plasma_fractal(32, 1.75, np.random.default_rng(0))
    assert cloud.shape == (32, 32) and cloud.min() == 0.0 and cloud.max() == 1.0
    neighbours = np.abs(np.diff(cloud, axis=1)).mean()
    assert neighbours < 0.5 * np.abs(cloud - cloud.mean()).mean()  # a cloud: neighbours closer than random pairs
    grey = np.full((3, 32, 32), 0.5)
    fogged = corruptions.fog(grey, 5, np.random.default_rng([0, 0]))
    expected = (grey + 1.5 * corruptions.plasma_fractal(32, 1.75, np.random.default_rng([0, 0]))) * 0.5 / 2.0
    np.testing.assert_allclose(fogged, expected)  # weight 1.5 at severity 5, scaled by max / (max + 1.5)
    assert np.array_equal(fogged[0], fogged[2])
    with pytest.raises(ValueError, match="power of two"):
        corruptions.plasma_fractal(24, 2.0, np.random.default_rng(0))


def test_glass_blur_copies_neighbours_between_two_blurs_and_zoom_and_gaussian_blur_keep_a_flat_image():
    flat, x = np.full((2, 3, 32, 32), 90, np.uint8), images(2)
    for name in ("glass_blur", "zoom_blur", "gaussian_blur"):
        assert np.abs(corruptions.corrupt(flat, name, 5).astype(int) - 90).max() <= 1, name
        out = corruptions.corrupt(x, name, 5)
        assert not np.array_equal(out, x) and np.array_equal(out, corruptions.corrupt(x, name)), name
    assert corruptions.corrupt(x, "gaussian_blur", 5).std() < corruptions.corrupt(x, "gaussian_blur", 1).std()
    distinct = np.arange(32 * 32).reshape(1, 32, 32).repeat(3, axis=0) / 1024  # every pixel its own value
    copied = corruptions.glass_blur(distinct, 1, np.random.default_rng(0))  # sigma 0.05: the blurs change nothing
    quantised = np.floor(distinct * 255) / 255
    assert set(np.unique(copied)) <= set(np.unique(quantised))  # each pixel holds a value the image had
    np.testing.assert_array_equal(copied[:, :2], quantised[:, :2])  # rows and columns 0, 1 are never written
    np.testing.assert_array_equal(copied[:, :, :2], quantised[:, :, :2])
    moved = (copied[0, 2:, 2:] != quantised[0, 2:, 2:]).mean()
    assert 0.5 < moved < 0.9  # 3 of 4 draws name another pixel (dy, dx in {-1, 0})
    assert not np.array_equal(np.sort(copied.ravel()), np.sort(quantised.ravel()))  # copies, not swaps
    spot = np.zeros((3, 32, 32))
    spot[:, 16, 16] = 1.0
    blurred = corruptions.gaussian_blur(spot, 5, np.random.default_rng(0))
    np.testing.assert_allclose(blurred.sum(axis=(1, 2)), 1.0)  # sigma 1: mass kept, spread around the spot
    assert blurred[0, 16, 16] == pytest.approx(1 / (2 * np.pi), rel=0.05)
    zoomed = corruptions.zoom_blur(spot, 5, np.random.default_rng(0))  # 26 zooms of 1.00 .. 1.25 averaged with it
    assert zoomed[0, 16, 16] < 1.0 and zoomed[0].sum() > 0


def test_generated_tasks_are_cached_and_registered(tmp_path, monkeypatch):
    monkeypatch.setenv("VITPLAST_CACHE_DIR", str(tmp_path))
    data = generated.digits_c("contrast")
    assert data.images.shape == (1797, 3, 32, 32) and data.images.dtype == np.uint8 and data.labels.max() == 9
    cached = list((tmp_path / "datasets").glob("digits_c-contrast-s5-*.npz"))
    assert len(cached) == 1 and np.array_equal(generated.digits_c("contrast").images, data.images)
    clean, _ = generated.upscaled_digits(32)
    assert data.images.std() < 0.3 * clean.std()  # contrast at severity 5: 0.15 of the distances to the mean
    assert datasets.num_classes("fractals_novel") == generated.NOVEL_CLASSES
    assert datasets.resolve_augmentation("digits_c:snow", None) == "light"
    with pytest.raises(UserError, match='needs a corruption, e.g. "digits_c:snow"'):
        datasets.check_dataset_name("digits_c:frost")
    with pytest.raises(UserError, match="fractals_novel_c:snow"):
        datasets.check_dataset_name("fractals_novel_c")
