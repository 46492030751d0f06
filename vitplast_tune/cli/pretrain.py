"""``vitplast pretrain``: pretrain the offline testbed ViT on generated fractals and write its checkpoint (every
field of ``PretrainConfig`` is a flag)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Sequence
from typing import NoReturn

from vitplast_tune import output_paths
from vitplast_tune.cli.base import Parser, add_dataclass_flags, run_main
from vitplast_tune.config import TESTBED_WEIGHTS
from vitplast_tune.pretrain_config import PretrainConfig

HELP = "Pretrain the offline testbed ViT on generated fractals and write its safetensors checkpoint."
PRETRAIN_HELP = """Pretrain the offline testbed ViT on generated fractals and write the shipped checkpoint.

    vitplast pretrain      # writes vitplast_tune/weights/vit_testbed_patch8_32.fractal.safetensors (+ .json)
"""


def parser() -> Parser:
    """The arguments of ``vitplast pretrain``: the output file and every field of ``PretrainConfig``."""
    p = Parser(
        prog="vitplast pretrain", description=PRETRAIN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out",
        default=str(TESTBED_WEIGHTS),
        help="safetensors file to write; the provenance JSON goes beside it (default: the shipped file)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="write over an existing --out file (such as the shipped weights)"
    )
    add_dataclass_flags(p, PretrainConfig())
    return p


def pretrain_main(argv: Sequence[str] | None = None) -> int:
    """Pretrain the testbed ViT from command-line arguments (every field of ``PretrainConfig`` is a flag)."""
    args = parser().parse_args(argv)
    config = PretrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PretrainConfig)}).validate()
    out = output_paths.output_file(args.out, "--out", suffix=".safetensors", overwrite=args.overwrite)
    output_paths.output_file(out.with_suffix(".json"), "--out's provenance file", overwrite=True)
    from vitplast_tune.vit.pretraining import pretrain_testbed

    command = shlex.join(["vitplast", "pretrain", *(sys.argv[1:] if argv is None else argv)])
    pretrain_testbed(out, config, command=command)
    return 0


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast pretrain`` (and its alias ``vitplast-pretrain``)."""
    run_main(lambda: pretrain_main(argv))
