"""Render formula-driven fractal images from iterated function systems (FractalDB-style, Kataoka et al. 2020).

Only exactly rounded arithmetic touches the points, so a seed gives the same bytes on any machine.
"""

from __future__ import annotations

import numpy as np
import torch

MAX_MAPS = 4
SUPERSAMPLE = 2  # render at 2x and sum 2x2 blocks: smoother, anti-aliased strokes
CHAINS = 192  # chaos-game chains per image
BURN_IN = 6  # iterations before points are kept (chains start on the attractor, this only spreads them)
KEEP = 12  # iterations whose points are kept: CHAINS * KEEP points per image
MIN_FILL = 0.12  # a class system must cover at least this fraction of the frame's pixels
CHUNK = 1024  # images rendered at once
ROTATE = 0.268  # tan(15 deg): instances rotate by up to +-30 degrees


def fractal_dataset(
    num_classes: int = 64,
    images_per_class: int = 20,
    image_size: int = 32,
    seed: int = 0,
    *,
    instance_seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Render a dataset of fractal images, class by class.

    Args:
        num_classes: How many classes (IFS systems).
        images_per_class: How many varied instances of each class.
        image_size: The side S of each image, in pixels.
        seed: The seed of the class systems; class c is the same for any larger ``num_classes``.
        instance_seed: The seed of the variations (None: ``seed``); another draws other instances of the same classes.

    Returns:
        The images, floats in [0, 1] shaped (N, 3, S, S), and their labels, class-major.
    """

    systems = class_systems(num_classes, seed)
    labels = np.repeat(np.arange(num_classes), images_per_class)
    rng = np.random.default_rng([seed, 1, seed if instance_seed is None else instance_seed])
    params = _vary(systems[labels], rng)
    chunks = [_render(params[i : i + CHUNK], image_size, rng, augment=True) for i in range(0, len(labels), CHUNK)]
    images = np.concatenate(chunks) if chunks else np.zeros((0, 3, image_size, image_size), np.float32)
    return torch.from_numpy(images), torch.from_numpy(labels).long()


def class_systems(num_classes: int, seed: int = 0) -> np.ndarray:
    """Return each class's IFS, (num_classes, MAX_MAPS, 8), kept only where its attractor fills the frame."""
    rng = np.random.default_rng([seed, 0])
    systems: list[np.ndarray] = []
    while len(systems) < num_classes:
        candidates = np.stack([_sample_system(rng) for _ in range(64)])
        fill = (_render(candidates, 32, rng, augment=False).max(axis=1) > 0.05).mean(axis=(1, 2))
        systems.extend(candidates[fill >= MIN_FILL])
    return np.stack(systems[:num_classes])


def _sample_system(rng: np.random.Generator) -> np.ndarray:
    """Draw one IFS whose singular values meet the sigma-factor rule (Anderson & Farrell 2022)."""
    n = int(rng.integers(2, MAX_MAPS + 1))
    while True:
        sigma = rng.uniform(0.05, 1.0, size=(n, 2))
        target = rng.uniform((5 + n) / 2, (6 + n) / 2)
        sigma = sigma * (target / (sigma[:, 0] + 2 * sigma[:, 1]).sum())
        if sigma.max() < 0.97:
            break
    maps = np.zeros((MAX_MAPS, 8))
    maps[:n, 0:2] = sigma
    maps[:n, 2] = rng.uniform(-1, 1, n)  # tan(theta / 2) of the first rotation
    maps[:n, 3] = rng.choice([-1.0, 1.0], n)  # its half-turn (covers the full circle)
    maps[:n, 4] = rng.uniform(-1, 1, n)  # tan(phi / 2) of the second rotation
    maps[:n, 5] = rng.choice([-1.0, 1.0], n)  # reflection
    maps[:n, 6:8] = rng.uniform(-1, 1, (n, 2))
    return maps


def _vary(params: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Jitter each system slightly; unused maps stay zero."""
    used = params[..., :1] > 0
    noise = np.zeros_like(params)
    noise[..., 0:2] = params[..., 0:2] * rng.uniform(-0.04, 0.04, params[..., 0:2].shape)
    noise[..., 2] = rng.uniform(-0.05, 0.05, params.shape[:2])
    noise[..., 4] = rng.uniform(-0.05, 0.05, params.shape[:2])
    noise[..., 6:8] = rng.uniform(-0.05, 0.05, params[..., 6:8].shape)
    out = params + noise * used
    out[..., 0:2] = np.minimum(out[..., 0:2], 0.97)
    return out


def _rotation(t: np.ndarray, sign: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (cos, sin) of the angle 2 atan(t), plus pi when sign < 0, by the rational parametrisation."""
    d = 1 + t * t
    return sign * (1 - t * t) / d, sign * 2 * t / d


def _matrices(params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the affine maps, translations and map probabilities of each system."""
    s1, s2, t1, sg, t2, fl = (params[..., i] for i in range(6))
    c1, n1 = _rotation(t1, sg)
    c2, n2 = _rotation(t2, np.ones_like(t2))
    # R(theta) diag(s1, s2) R(phi) = [[c1 s1 c2 - n1 s2 n2, -c1 s1 n2 - n1 s2 c2],
    #                                 [n1 s1 c2 + c1 s2 n2, -n1 s1 n2 + c1 s2 c2]]
    a = np.stack(
        [
            (c1 * s1 * c2 - n1 * s2 * n2) * fl,
            -c1 * s1 * n2 - n1 * s2 * c2,
            (n1 * s1 * c2 + c1 * s2 * n2) * fl,
            -n1 * s1 * n2 + c1 * s2 * c2,
        ],
        axis=-1,
    )
    weight = np.where(s1 > 0, s1 * s2 + 0.02, 0.0)  # probability ~ |det A|, with a floor
    cum = np.cumsum(weight, axis=-1)
    return a, params[..., 6:8], cum / cum[..., -1:]


def _render(params: np.ndarray, size: int, rng: np.random.Generator, augment: bool) -> np.ndarray:
    """Render B systems by the chaos game into (B, 3, size, size) float32 images in [0, 1]."""
    b = len(params)
    a, shift, cum = _matrices(params)
    rows = np.arange(b)[:, None]
    # Start every chain at the fixed point of the most likely map: it lies on the attractor.
    k0 = np.argmax(np.diff(cum, prepend=0.0, axis=-1), axis=-1)
    m, t = a[np.arange(b), k0], shift[np.arange(b), k0]
    det = (1 - m[:, 0]) * (1 - m[:, 3]) - m[:, 1] * m[:, 2]
    x = np.repeat((((1 - m[:, 3]) * t[:, 0] + m[:, 1] * t[:, 1]) / det)[:, None], CHAINS, axis=1)
    y = np.repeat(((m[:, 2] * t[:, 0] + (1 - m[:, 0]) * t[:, 1]) / det)[:, None], CHAINS, axis=1)
    xs, ys = [], []
    for step in range(BURN_IN + KEEP):
        k = (rng.random((b, CHAINS))[..., None] > cum[:, None, :-1]).sum(-1)
        ak, bk = a[rows, k], shift[rows, k]
        x, y = ak[..., 0] * x + ak[..., 1] * y + bk[..., 0], ak[..., 2] * x + ak[..., 3] * y + bk[..., 1]
        if step >= BURN_IN:
            xs.append(x)
            ys.append(y)
    x, y = np.concatenate(xs, axis=1), np.concatenate(ys, axis=1)

    if augment:  # rotation (up to 30 degrees), flip, then scale and shift inside the frame
        c, s = _rotation(rng.uniform(-ROTATE, ROTATE, (b, 1)), np.ones((b, 1)))
        x, y = (c * x - s * y) * rng.choice([-1.0, 1.0], (b, 1)), s * x + c * y
        scale, offset = rng.uniform(0.7, 0.95, (b, 1)), rng.uniform(-1, 1, (b, 2, 1))
    else:
        scale, offset = np.full((b, 1), 0.9), np.zeros((b, 2, 1))
    lo_x, hi_x, lo_y, hi_y = (
        x.min(1, keepdims=True),
        x.max(1, keepdims=True),
        y.min(1, keepdims=True),
        y.max(1, keepdims=True),
    )
    extent = np.maximum(np.maximum(hi_x - lo_x, hi_y - lo_y), 1e-9)
    fine = size * SUPERSAMPLE
    unit = scale / extent * fine  # fine pixels per unit of the system's coordinates
    slack_x, slack_y = (fine - (hi_x - lo_x) * unit) / 2, (fine - (hi_y - lo_y) * unit) / 2
    px = (x - lo_x) * unit + slack_x * (1 + offset[:, 0])
    py = (y - lo_y) * unit + slack_y * (1 + offset[:, 1])
    px = np.clip(np.floor(px), 0, fine - 1).astype(np.int64)
    py = np.clip(np.floor(py), 0, fine - 1).astype(np.int64)

    counts = np.bincount(((rows * fine + py) * fine + px).ravel(), minlength=b * fine * fine)
    counts = counts.reshape(b, size, SUPERSAMPLE, size, SUPERSAMPLE).sum(axis=(2, 4))
    # Intensity: sqrt of the density relative to the mean over covered pixels, saturating at 1.
    covered = np.maximum((counts > 0).sum(axis=(1, 2), keepdims=True), 1)
    mean = counts.sum(axis=(1, 2), keepdims=True) / covered
    value = np.sqrt(np.minimum(counts / mean, 1.0))
    if augment:
        colour = rng.uniform(0.3, 1.0, (b, 3))
        colour = colour / colour.max(axis=1, keepdims=True)
    else:
        colour = np.ones((b, 3))
    return (value[:, None] * colour[:, :, None, None]).astype(np.float32)
