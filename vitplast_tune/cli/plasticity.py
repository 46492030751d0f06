"""``vitplast plasticity``: measure the plasticity of every ViT component between a reference distribution and a
downstream test split; write the per-layer table and a plot, print the ranking."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NoReturn

from vitplast_tune import output_paths
from vitplast_tune.cli.base import Parser, positive_int, run_main
from vitplast_tune.config import PLASTICITY_VARIANTS, TESTBED_MODEL

HELP = "Measure the plasticity of every ViT component between a reference and a downstream dataset."
PLASTICITY_HELP = """Measure the plasticity of every ViT component between a reference distribution and a downstream test split.

Writes the per-layer table (CSV + JSON) and a plot, and prints the per-component ranking.
The paper pairs ImageNet val with the downstream test split; offline, the reference is the
project's fractal distribution (the testbed's pretraining data).
"""


def parser() -> argparse.ArgumentParser:
    """The arguments of ``vitplast plasticity``."""

    p = Parser(
        prog="vitplast plasticity", description=PLASTICITY_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        default=TESTBED_MODEL,
        help=f"timm model name with an optional pretrained tag (default: {TESTBED_MODEL})",
    )
    p.add_argument(
        "--weights",
        default=None,
        help="local weights file (safetensors or torch state dict) to load instead of the tag's",
    )
    p.add_argument(
        "--no-pretrained", action="store_true", help="random initialisation: load no weights (for checks only)"
    )
    p.add_argument(
        "--dataset",
        default="digits",
        help="downstream dataset; its test split is paired with the reference (default: digits)",
    )
    p.add_argument(
        "--reference",
        default="fractals",
        help="reference (pretraining-like) dataset (default: fractals; the paper uses ImageNet val)",
    )
    p.add_argument(
        "--reference-split",
        choices=("test", "train"),
        default="test",
        help="split of the reference dataset to use (default: test)",
    )
    p.add_argument("--data-dir", default=None, help="where datasets live (default: ~/.cache/vitplast_tune/data)")
    p.add_argument("--download", action="store_true", help="download missing torchvision datasets")
    p.add_argument(
        "--variant",
        choices=PLASTICITY_VARIANTS,
        default="paper",
        help="paper: every component applied to the embedding output (the paper's definition, default); "
        "in_network: every component on its real input in the forward pass",
    )
    p.add_argument("--batch-size", type=positive_int, default=64, help="pairs per batch (default: 64)")
    p.add_argument(
        "--max-pairs",
        type=positive_int,
        default=None,
        help="stop after this many pairs (default: all; the paper uses 12,800)",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="output directory (default: ~/.cache/vitplast_tune/plasticity/<model>__<dataset>__vs__<reference>__<variant>)",
    )
    return p


def plasticity_main(argv: Sequence[str] | None = None) -> int:
    """Measure plasticity from command-line arguments; print the ranking and the files written."""
    args = parser().parse_args(argv)
    from vitplast_tune.data import datasets
    from vitplast_tune.predictors.report import plasticity_report
    from vitplast_tune.vit.devices import resolve_device

    resolve_device(args.device)  # before any work: a device torch does not know, or a GPU that is not there
    datasets.check_applies((args.dataset, args.reference), args.data_dir, args.download)
    if args.out is not None:
        output_paths.output_dir(args.out, "--out")

    report = plasticity_report(
        args.model,
        weights=args.weights,
        pretrained=not args.no_pretrained,
        dataset=args.dataset,
        reference=args.reference,
        reference_split=args.reference_split,
        data_dir=args.data_dir,
        download=args.download,
        variant=args.variant,
        batch_size=args.batch_size,
        max_pairs=args.max_pairs,
        out_dir=args.out,
        device=args.device,
    )
    meta = report.meta
    print(
        f"plasticity ({meta['variant']} variant) of {meta['model']}: {meta['dataset']} test vs "
        f"{meta['reference']} {meta['reference_split']}, {meta['n_pairs']} pairs, {meta['seconds']:.1f} s"
    )
    print(ranking_text(report.ranking))
    for kind, path in report.files.items():
        print(f"{kind:>4}: {path}")
    return 0


def ranking_text(ranking) -> str:
    """The per-component table as printed: a component without a rank shows ``-``, and a line says why ``emb`` has
    none (``predictors.scores.aggregate_plasticity``)."""
    unranked = ranking["rank"].isna()
    shown = ranking.assign(rank=ranking["rank"].astype(object).where(~unranked, "-"))
    text = shown.to_string(index=False, float_format=lambda v: f"{v:.4g}")
    if unranked.any() and "emb" in set(ranking.loc[unranked, "component"]):
        text += (
            "\n(emb has no rank: its ratio is measured from the pixels, a scale of its own; the block components are "
            "ranked among themselves, 1 = most plastic)"
        )
    return text


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast plasticity`` (and its alias ``vitplast-plasticity``)."""
    run_main(lambda: plasticity_main(argv))
