"""Corrupt images as CIFAR-10-C does (Hendrycks & Dietterich, ICLR 2019), at its 32 px parameters, in numpy and scipy.

Each image draws from its own generator, so a corrupted dataset is the same bytes for a seed on any machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import ndimage

SEVERITIES = (1, 2, 3, 4, 5)

# Per severity 1..5, as CIFAR-10-C's generator has them for 32-px images.
_CONTRAST = (0.75, 0.5, 0.4, 0.3, 0.15)  # factor on the distance to each channel's mean
_GAUSSIAN = (0.04, 0.06, 0.08, 0.09, 0.10)  # noise std on [0, 1]
_SPECKLE = (0.06, 0.1, 0.12, 0.16, 0.2)  # multiplicative noise std
_MOTION = ((6, 1.0), (6, 1.5), (6, 2.0), (8, 2.0), (9, 2.5))  # kernel radius, sigma (pixels)
_SHOT = (500, 250, 100, 75, 50)  # photons per unit intensity (Poisson)
_IMPULSE = (0.01, 0.02, 0.05, 0.08, 0.14)  # fraction of values set to 0 or 1
_DEFOCUS = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1))  # disk radius, its smoothing sigma (pixels)
_PIXELATE = (0.95, 0.9, 0.85, 0.75, 0.65)  # side kept, before the box resampling back
_JPEG = (80, 65, 58, 50, 40)  # JPEG quality
_FOG = ((0.2, 3.0), (0.5, 3.0), (0.75, 2.5), (1.0, 2.0), (1.5, 1.75))  # fog layer's weight, its roughness decay
_GLASS = ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2))  # blur sigma, swap distance, passes
_ZOOM = (1.06, 1.11, 1.16, 1.21, 1.26)  # zooms 1.00, 1.01, ... below this, averaged with the image
_GAUSSIAN_BLUR = (0.4, 0.6, 0.7, 0.8, 1.0)  # blur sigma (pixels)
# snow: layer mean, layer std, zoom, threshold, blur radius, blur sigma, weight of the image
_SNOW = (
    (0.1, 0.2, 1.0, 0.6, 8, 3, 0.95),
    (0.1, 0.2, 1.0, 0.5, 10, 4, 0.9),
    (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
    (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
    (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
)


def contrast(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Pull each channel toward its mean over the image."""
    means = x.mean(axis=(1, 2), keepdims=True)
    return (x - means) * _CONTRAST[severity - 1] + means


def gaussian_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Add Gaussian noise of std 0.04 to 0.10."""
    return x + rng.normal(scale=_GAUSSIAN[severity - 1], size=x.shape)


def speckle_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Add multiplicative noise: x + x * N(0, std)."""
    return x + x * rng.normal(scale=_SPECKLE[severity - 1], size=x.shape)


def motion_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Blur along a random angle in [-45, 45] degrees with ImageMagick's kernel."""
    radius, sigma = _MOTION[severity - 1]
    return line_blur(x, radius, sigma, rng.uniform(-45, 45))


def snow(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Add a thresholded, zoomed and motion-blurred noise layer twice, over a brightened image."""
    mean, std, zoom, threshold, radius, sigma, keep = _SNOW[severity - 1]
    height, width = x.shape[1:]
    layer = _clipped_zoom(rng.normal(loc=mean, scale=std, size=(height, width)), zoom)
    layer[layer < threshold] = 0
    layer = np.round(np.clip(layer, 0, 1) * 255) / 255  # the generator passes the layer through an 8-bit image
    layer = np.clip(line_blur(layer[None], radius, sigma, rng.uniform(-135, -45))[0], 0, 1)
    grey = 0.299 * x[0] + 0.587 * x[1] + 0.114 * x[2]
    x = keep * x + (1 - keep) * np.maximum(x, grey * 1.5 + 0.5)
    return x + layer + np.rot90(layer, k=2)


def shot_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Draw each value as a Poisson count of 500 down to 50 photons per unit intensity."""
    photons = _SHOT[severity - 1]
    return rng.poisson(x * photons) / photons


def impulse_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Set 1% to 14% of the values to 0 or 1, half each."""
    hit = rng.random(x.shape) < _IMPULSE[severity - 1]
    salt = rng.random(x.shape) < 0.5
    return np.where(hit, salt.astype(np.float64), x)


def defocus_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Convolve each channel with a smoothed disk of radius 0.3 to 1.5 pixels."""
    radius, sigma = _DEFOCUS[severity - 1]
    side = np.arange(-8, 9) if radius <= 8 else np.arange(-radius, radius + 1)
    xx, yy = np.meshgrid(side, side)
    disk = ((xx**2 + yy**2) <= radius**2).astype(np.float64)
    disk = ndimage.gaussian_filter(disk / disk.sum(), sigma, truncate=1.0 / sigma)  # a 3x3 smoothing, as OpenCV's
    return np.stack([ndimage.convolve(channel, disk, mode="reflect") for channel in x])


def pixelate(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Box-resample the image to 95% down to 65% of its side, and back."""
    from PIL import Image

    side = x.shape[1]
    small = int(side * _PIXELATE[severity - 1])
    image = Image.fromarray(_to_uint8(x)).resize((small, small), Image.Resampling.BOX)
    return np.asarray(image.resize((side, side), Image.Resampling.BOX), np.float64).transpose(2, 0, 1) / 255


def jpeg_compression(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Compress the image as JPEG at quality 80 down to 40, and decode it again."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(_to_uint8(x)).save(buffer, "JPEG", quality=_JPEG[severity - 1])
    return np.asarray(Image.open(buffer), np.float64).transpose(2, 0, 1) / 255


def fog(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Add a plasma-fractal cloud, then scale the image back to its brightest."""
    weight, decay = _FOG[severity - 1]
    brightest = x.max()
    height, width = x.shape[1:]
    side = 1 << (max(height, width) - 1).bit_length()  # the cloud's side: a power of two, cut to the image
    clouded = x + weight * plasma_fractal(side, decay, rng)[None, :height, :width]
    return clouded * brightest / (brightest + weight)


def glass_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Blur, give each pixel a random neighbour's value once or twice over, and blur again.

    CIFAR-10-C's generator swaps two numpy views, which copies the neighbour and leaves it as it was; so does this.
    """
    sigma, delta, passes = _GLASS[severity - 1]
    x = np.floor(_blur(x, sigma) * 255) / 255
    height, width = x.shape[1:]
    for _ in range(passes):
        for h in range(height - delta, delta, -1):
            for w in range(width - delta, delta, -1):
                dx, dy = rng.integers(-delta, delta, size=2)  # numpy's exclusive bound: -1 or 0 at delta 1
                x[:, h, w] = x[:, h + dy, w + dx]
    return _blur(x, sigma)


def zoom_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Average the image with its centre zoomed by 1.00, 1.01, ... up to 1.05 to 1.25."""
    factors = np.arange(1, _ZOOM[severity - 1], 0.01)
    zoomed = sum(np.stack([_clipped_zoom(channel, factor) for channel in x]) for factor in factors)
    return (x + zoomed) / (len(factors) + 1)


def gaussian_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Blur with a Gaussian of sigma 0.4 to 1 pixel, the edges extended."""
    return _blur(x, _GAUSSIAN_BLUR[severity - 1])


def _blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """Blur (C, H, W) images within each channel, the edges extended, as scikit-image's ``gaussian``."""
    return ndimage.gaussian_filter(x, sigma=(0, sigma, sigma), mode="nearest", truncate=4.0)


def _to_uint8(x: np.ndarray) -> np.ndarray:
    """Return (3, H, W) floats in [0, 1] as an (H, W, 3) uint8 image."""
    return np.clip(np.round(x * 255), 0, 255).astype(np.uint8).transpose(1, 2, 0)


CORRUPTIONS: dict[str, Callable[[np.ndarray, int, np.random.Generator], np.ndarray]] = {
    "contrast": contrast,
    "gaussian_noise": gaussian_noise,
    "motion_blur": motion_blur,
    "snow": snow,
    "speckle_noise": speckle_noise,
    "shot_noise": shot_noise,
    "impulse_noise": impulse_noise,
    "defocus_blur": defocus_blur,
    "pixelate": pixelate,
    "jpeg_compression": jpeg_compression,
    "fog": fog,
    "glass_blur": glass_blur,
    "zoom_blur": zoom_blur,
    "gaussian_blur": gaussian_blur,
}


def corrupt(images: np.ndarray, name: str, severity: int = 5, seed: int = 0) -> np.ndarray:
    """Return uint8 images (N, 3, H, W) under corruption ``name`` at ``severity``; image i draws from ``[seed, i]``."""
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; known: {', '.join(CORRUPTIONS)}")
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {SEVERITIES}, not {severity}")
    fn = CORRUPTIONS[name]
    out = np.empty_like(images)
    for i, image in enumerate(images):
        x = fn(image.astype(np.float64) / 255.0, severity, np.random.default_rng([seed, i]))
        out[i] = np.clip(np.round(np.clip(x, 0, 1) * 255), 0, 255).astype(np.uint8)
    return out


def line_blur(x: np.ndarray, radius: int, sigma: float, angle: float) -> np.ndarray:
    """Blur (C, H, W) images as ImageMagick's motion blur: shifted along ``angle``, weighted by a one-sided Gaussian."""
    width = 2 * radius + 1
    weights = np.exp(-(np.arange(width) ** 2) / (2 * sigma**2))
    weights /= weights.sum()
    dy_unit, dx_unit = math.sin(math.radians(angle)), math.cos(math.radians(angle))
    out = np.zeros_like(x, dtype=np.float64)
    for i, weight in enumerate(weights):
        dy, dx = -math.ceil(i * dy_unit - 0.5), -math.ceil(i * dx_unit - 0.5)
        if abs(dy) >= x.shape[1] or abs(dx) >= x.shape[2]:
            break
        out += weight * _shifted(x, dy, dx)
    return out


def _shifted(x: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Move (C, H, W) images by (dy, dx) pixels, filling with the nearest edge pixels."""
    height, width = x.shape[1:]
    rows = np.clip(np.arange(height) - dy, 0, height - 1)
    cols = np.clip(np.arange(width) - dx, 0, width - 1)
    return x[:, rows][:, :, cols]


def _clipped_zoom(layer: np.ndarray, factor: float) -> np.ndarray:
    """Zoom a (H, W) array's centre, ``1 / factor`` of its side, back to its size."""
    side = layer.shape[0]
    crop = int(np.ceil(side / factor))
    top = (side - crop) // 2
    zoomed = ndimage.zoom(layer[top : top + crop, top : top + crop], factor, order=1)
    trim = (zoomed.shape[0] - side) // 2
    return zoomed[trim : trim + side, trim : trim + side]


def plasma_fractal(side: int, decay: float, rng: np.random.Generator) -> np.ndarray:
    """Draw a (side, side) cloud in [0, 1] by the diamond-square algorithm, as CIFAR-10-C's fog does."""
    if side < 2 or side & (side - 1):
        raise ValueError(f"the plasma fractal's side must be a power of two, not {side}")
    cloud = np.zeros((side, side))
    step, wibble = side, 100.0
    while step >= 2:
        half = step // 2
        corners = cloud[0::step, 0::step]
        centres = corners + np.roll(corners, -1, axis=0)
        centres = centres + np.roll(centres, -1, axis=1)  # the sum of each square's four corners
        cloud[half::step, half::step] = centres / 4 + wibble * rng.uniform(-wibble, wibble, centres.shape)
        centres = cloud[half::step, half::step]
        across = centres + np.roll(centres, 1, axis=0) + corners + np.roll(corners, -1, axis=1)
        cloud[0::step, half::step] = across / 4 + wibble * rng.uniform(-wibble, wibble, across.shape)
        down = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=0)
        cloud[half::step, 0::step] = down / 4 + wibble * rng.uniform(-wibble, wibble, down.shape)
        step, wibble = half, wibble / decay
    cloud -= cloud.min()
    return cloud / cloud.max()
