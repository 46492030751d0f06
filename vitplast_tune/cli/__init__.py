"""The command line: one command, ``vitplast``, with a subcommand per job (``vitplast search``, ``analyze``,
``plasticity``, ``pretrain``, ``recommend``, ``ui``, ``lab``, ``list``, ``status``), one module each; ``python -m vitplast_tune``, the
``vitplast-COMMAND`` aliases and ``scripts/*.py`` call the same entry points.

Heavy modules (Ray, torch, timm) are imported inside the commands, so ``--help`` and bad flags answer at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from vitplast_tune import __version__
from vitplast_tune.cli import analyze, lab, listing, plasticity, pretrain, recommend, search, status, ui
from vitplast_tune.cli.base import Parser

_MODULES = {"search": search, "analyze": analyze, "plasticity": plasticity, "pretrain": pretrain}
_MODULES.update(recommend=recommend, ui=ui, lab=lab, list=listing, status=status)
# Each subcommand's entry point: ``COMMANDS[name](argv)`` runs it and exits.
COMMANDS: dict[str, Callable[[Sequence[str] | None], NoReturn]] = {name: m.entry for name, m in _MODULES.items()}
EXAMPLE = "vitplast search --space component_subsets      # the offline quickstart: 60 trials on the testbed ViT"


def parser() -> argparse.ArgumentParser:
    """``vitplast``'s own arguments: the subcommand (each listed with its one sentence) and what follows it."""
    p = Parser(
        prog="vitplast",
        description="Which components of a pretrained ViT to finetune, and how: searched with Ray Tune, judged "
        "against their plasticity.",
        epilog=f"example:\n  {EXAMPLE}\n\n`vitplast COMMAND --help` lists a command's flags.",
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=16, width=120),
    )
    p.add_argument("--version", action="version", version=f"vitplast_tune {__version__}")
    commands = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, module in _MODULES.items():
        commands.add_parser(name, help=module.HELP, add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """``vitplast COMMAND [flags]``: the subcommand's entry point with its flags (``vitplast --help`` lists them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        parser().print_help(sys.stderr)
        sys.exit(2)
    if argv[0] not in COMMANDS:
        parser().parse_args(argv)  # --help, --version; an unknown command is one line and exit 2
        sys.exit(2)
    COMMANDS[argv[0]](argv[1:])
