"""Whether the input pipeline keeps up, and what the datasets cost in host memory, measured in one run.

Bytes: per dataset held in memory, what a node and a trial hold at 224 px before this change (every
image decoded to float32 at the model's input size on the driver, put in the object store and
copied into each trial; CIFAR-10/100 read per image by torchvision, its uint8 arrays loaded once per
split object in each trial) and after it (uint8 at native resolution, once per node in the object
store, read zero-copy by the trials, which hold one float batch at a time).

Speed, on one CPU core (torch and PIL single-threaded): images/s of each transform path from the
stored images to a normalized 224 px batch: timm's per-image PIL transforms, and the batched
transforms of ``vitplast_tune.data.transforms`` on the CPU, for CIFAR-size (32 px) sources, full JPEG
decoding (500x375, Pets-like) and the same JPEGs read from their image cache (``image_cache: 256``,
image_cache.py), with the one-time speed of building that cache; against the
model's training images/s (full finetuning, fp32) on every core of the same machine. The ratio
``cores needed`` = model images/s / pipeline images/s per core.

    python -m benchmarks.data --json bench_data.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from benchmarks import common
from vitplast_tune.data import image_cache, transforms
from vitplast_tune.vit import models

# (images, channels, height, width) held in memory, and the training split a trial used to hold before.
DATASETS = {
    "digits": (1797, 1, 8, 8),
    "cifar10": (60000, 3, 32, 32),
    "cifar100": (60000, 3, 32, 32),
    "cifar10c:<corruption>": (10000, 3, 32, 32),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument(
        "--model", default="vit_base_patch16_224", help="timm ViT, randomly initialised (default: vit_base_patch16_224)"
    )
    p.add_argument("--batch-size", type=common.at_least(1), default=64, help="pipeline batch (default: 64)")
    p.add_argument("--model-batch", type=common.at_least(1), default=8, help="training batch of the model (default: 8)")
    p.add_argument("--seconds", type=common.above(0), default=3.0, help="time per pipeline measurement (default: 3)")
    p.add_argument(
        "--model-steps", type=common.at_least(1), default=3, help="timed training steps (default: 3, after one untimed)"
    )
    common.add_json_flag(p, help="write the results here")
    return p.parse_args(argv)


def host_bytes(batch_size: int, size: int = 224) -> list[dict]:
    """Host bytes per node and per trial at ``size`` px, before and after, for each in-memory dataset."""
    rows = []
    for name, (n, c, h, w) in DATASETS.items():
        float_224 = n * 3 * size * size * 4
        native = n * c * h * w
        if name.startswith("cifar1") and ":" not in name:  # torchvision per image: uint8 arrays in every trial
            before_node, before_trial = 0, 2 * 50000 * c * h * w + 10000 * c * h * w  # train split loaded twice + test
        else:  # float32 at 224 px: the driver's tensor + the object store's copy; each trial's own copy
            before_node, before_trial = 2 * float_224, float_224
        batch = batch_size * 3 * size * size * 4
        rows.append(
            dict(dataset=name, before_node=before_node, before_trial=before_trial, after_node=native, after_trial=batch)
        )
    return rows


def images_per_s(fn: Callable[[], int], seconds: float) -> float:
    """Images/s of ``fn`` (returns how many images it made), after one untimed call."""
    fn()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += fn()
    return done / (time.perf_counter() - start)


def pipelines(config: dict, batch: int, seconds: float) -> dict[str, float]:
    """Images/s per core of each transform path to a normalized batch at the model's input size."""
    from PIL import Image

    rng = np.random.default_rng(0)
    small = rng.integers(0, 255, (batch, 3, 32, 32), dtype=np.uint8)
    jpegs = []
    for _ in range(8):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (375, 500, 3), dtype=np.uint8)).save(buffer, "JPEG", quality=90)
        jpegs.append(buffer.getvalue())
    pil_small = [Image.fromarray(im.transpose(1, 2, 0)) for im in small]
    decoded_jpegs = lambda: [(Image.open(io.BytesIO(b)), 0) for b in jpegs]  # a dataset of (PIL image, label)

    def per_image(train: bool, images) -> Callable[[], int]:
        tf = transforms.per_image(config, train)
        return lambda: len(torch.stack([tf(im) for im in images]))

    def batched(train: bool, images: np.ndarray) -> Callable[[], int]:
        return lambda: len(transforms.batch_transform(torch.from_numpy(images), config, train, seed=0))

    def jpeg_train() -> int:
        tf = transforms.per_image(config, True)
        return len(torch.stack([tf(Image.open(io.BytesIO(b)).convert("RGB")) for b in jpegs]))

    with common.scratch("bench_data_") as tmp:
        builds = iter(range(10**9))

        def build() -> int:  # a new cache each call: the one-time build (its "decoded ..." line silenced)
            with contextlib.redirect_stderr(io.StringIO()):
                image_cache.ensure(decoded_jpegs, f"build{next(builds)}", 256, tmp)
            return len(jpegs)

        directory = image_cache.ensure(decoded_jpegs, "jpegs", 256, tmp)
        cache = image_cache.CachedImages(directory, transforms.per_image(config, True))
        from_cache = lambda: len(torch.stack([cache[i][0] for i in range(len(cache))]))
        paths = {
            "32px train, per image (timm, PIL)": per_image(True, pil_small),
            "32px train, batched on the CPU": batched(True, small),
            "32px eval, per image (timm, PIL)": per_image(False, pil_small),
            "32px eval, batched on the CPU": batched(False, small),
            "JPEG 500x375 decode + train, per image": jpeg_train,
            "image cache (256 px) + train, per image": from_cache,
            "building the image cache (once): JPEG decode, resize to 256 px, write": build,
        }
        return {name: images_per_s(fn, seconds) for name, fn in paths.items()}


def model_images_per_s(model_name: str, batch: int, steps: int) -> float:
    """Training images/s of full finetuning (fp32, SGD) on every core of this machine."""
    model = models.create_model(model_name, 10, pretrained=False).train()
    size = models.data_config(model)["input_size"][-1]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = models.pretrained_data_config(args.model)
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(1)
    speeds = pipelines(config, args.batch_size, args.seconds)
    torch.set_num_threads(cores)
    model_speed = model_images_per_s(args.model, args.model_batch, args.model_steps)
    result = dict(
        model=args.model,
        cores=cores,
        model_images_per_s=model_speed,
        pipelines=speeds,
        bytes=host_bytes(args.batch_size),
        date=time.strftime("%Y-%m-%d"),
    )
    print(format_tables(result))
    common.write_json(args.json, result)
    return 0


def format_tables(result: dict) -> str:
    """Markdown tables of bytes and speeds."""
    mb = lambda b: f"{b / 2**20:,.1f} MiB" if b < 2**30 else f"{b / 2**30:,.2f} GiB"
    lines = [
        "| dataset (224 px) | node before | node after | trial before | trial after (one float batch) |",
        "|---|---|---|---|---|",
    ]
    for r in result["bytes"]:
        lines.append(
            f"| {r['dataset']} | {mb(r['before_node'])} | {mb(r['after_node'])} | {mb(r['before_trial'])} | {mb(r['after_trial'])} |"
        )
    model = result["model_images_per_s"]
    lines += [
        "",
        f"{result['model']} full finetuning, fp32, {result['cores']} cores: {model:,.1f} training images/s",
        "",
        "| input path (to a normalized 224 px batch) | images/s per core | cores needed to feed the model |",
        "|---|---|---|",
    ]
    for name, speed in result["pipelines"].items():
        lines.append(f"| {name} | {speed:,.0f} | {model / speed:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
