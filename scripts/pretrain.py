"""Pretrain the offline testbed ViT on generated fractals and write the shipped checkpoint.

    python scripts/pretrain.py            # writes vitplast_tune/weights/vit_testbed_patch8_32.fractal.safetensors (+ .json)
"""

from __future__ import annotations

import argparse
import shlex
import sys

from vitplast_tune.models import TESTBED_WEIGHTS
from vitplast_tune.pretraining import pretrain_testbed


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(TESTBED_WEIGHTS), help="safetensors file to write; the provenance JSON goes beside it (default: the shipped file)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialisation, batch order and fractal variations (default: 0)")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the fractal class systems; 0 matches the 'fractals' dataset (default: 0)")
    p.add_argument("--steps", type=int, default=5000, help="optimizer steps (default: 5000)")
    p.add_argument("--batch-size", type=int, default=128, help="images per step (default: 128)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate (default: 2e-3)")
    p.add_argument("--weight-decay", type=float, default=0.05, help="AdamW weight decay on matrices (default: 0.05)")
    p.add_argument("--warmup-steps", type=int, default=200, help="linear warm-up steps before the cosine decay (default: 200)")
    p.add_argument("--label-smoothing", type=float, default=0.1, help="label smoothing of the cross-entropy (default: 0.1)")
    p.add_argument("--num-classes", type=int, default=64, help="fractal classes; the shipped config expects 64 (default: 64)")
    p.add_argument("--images-per-class", type=int, default=1500, help="training fractals per class, generated in memory (default: 1500)")
    p.add_argument("--heldout-per-class", type=int, default=50, help="held-out fractals per class for the accuracy check (default: 50)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads; fixed for reproducibility (default: 2)")
    p.add_argument("--log-every", type=int, default=100, help="print progress every this many steps; held-out accuracy every 10x (default: 100)")
    args = p.parse_args(argv)
    command = shlex.join(["python", "scripts/pretrain.py", *(sys.argv[1:] if argv is None else argv)])
    pretrain_testbed(
        args.out, seed=args.seed, data_seed=args.data_seed, steps=args.steps, batch_size=args.batch_size,
        lr=args.lr, weight_decay=args.weight_decay, warmup_steps=args.warmup_steps,
        label_smoothing=args.label_smoothing, num_classes=args.num_classes,
        images_per_class=args.images_per_class, heldout_per_class=args.heldout_per_class,
        threads=args.threads, log_every=args.log_every, command=command,
    )


if __name__ == "__main__":
    main()
