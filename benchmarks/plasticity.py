"""Time compute_plasticity (both variants) against plain forward passes of the same 2N images.

The headline is the ratio plasticity time / forward time (target: <= 1.1x for the paper variant),
measured in one run: same device, inference_mode, and the same batches (batch_size pairs, i.e.
2 x batch_size images, per forward call), after a warm-up, as the median of a few interleaved
repeats. Random images and a randomly initialised model: timing does not depend
on the weights.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch

from benchmarks import common
from vitplast_tune.config import PLASTICITY_VARIANTS
from vitplast_tune.errors import UserError
from vitplast_tune.vit.models import create_model
from vitplast_tune.vit.plasticity import compute_plasticity


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument(
        "--model",
        default="vit_testbed_patch8_32",
        help="timm architecture, randomly initialised (default: vit_testbed_patch8_32)",
    )
    p.add_argument(
        "--batch-size",
        type=common.at_least(1),
        default=64,
        help="pairs per batch; the forward baseline runs 2x this many images per call (default: 64)",
    )
    p.add_argument(
        "--pairs",
        type=common.at_least(1),
        default=1024,
        help="number of pairs N; the baseline forwards 2N images (default: 1024)",
    )
    p.add_argument(
        "--repeats",
        type=common.at_least(1),
        default=5,
        help="timed repeats; the median is reported (default: 5)",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument(
        "--threads", type=common.at_least(1), default=None, help="torch CPU threads (default: torch's choice)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = common.pick_device(args.device)
    try:
        model = create_model(args.model, 0, pretrained=False).eval().to(device)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    size = model.patch_embed.img_size
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.pairs, 3, *size, generator=generator).to(device)
    y = torch.randn(args.pairs, 3, *size, generator=generator).to(device)

    def forward() -> None:
        with torch.inference_mode():  # the same 2N images, batch_size pairs (2 x batch_size images) per call
            for xb, yb in zip(x.split(args.batch_size), y.split(args.batch_size)):
                model(torch.cat([xb, yb]))

    fns: dict[str, Callable[[], object]] = {"forward": forward}
    for variant in PLASTICITY_VARIANTS:
        fns[variant] = lambda v=variant: compute_plasticity(
            model, x, y, variant=v, batch_size=args.batch_size, device=device
        )
    seconds = common.median_seconds(fns, device, args.repeats)
    base = seconds.pop("forward")
    print(
        f"{args.model} on {device}: {args.pairs} pairs, batch {args.batch_size} pairs, median of {args.repeats} "
        f"(torch threads {torch.get_num_threads()})"
    )
    for variant, t in seconds.items():
        print(f"  {variant:<11} {t / base:5.2f}x forward   ({t * 1e3:.0f} ms vs {base * 1e3:.0f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
