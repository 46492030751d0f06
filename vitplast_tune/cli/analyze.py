"""``vitplast analyze``: analyze finished searches again (one: the summary; several: the paper's cross-dataset
table)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from vitplast_tune import outputs
from vitplast_tune.cli.base import Parser, run_main

HELP = "Analyze finished searches again: correlations and plots logged to MLflow, or a cross-dataset table."


def parser() -> Parser:
    """The arguments of ``vitplast analyze``."""
    p = Parser(prog="vitplast analyze", description=HELP)
    p.add_argument("--name", action="append", required=True, help="a search's name; repeat for several datasets")
    p.add_argument("--storage", help="where the searches' results lie; default ~/vitplast_tune_results")
    p.add_argument("--tracking-uri", help="MLflow tracking URI; default: the one the search used")
    p.add_argument("--criteria", action="store_true", help="also the criteria lab: pre-training predictors per subset")
    p.add_argument("--out", help="where the cross-dataset files go; default <storage>/cross-<names>")
    return p


def analyze_main(argv: Sequence[str] | None = None) -> int:
    """Analyze finished searches again and print the summary (one --name) or the cross-dataset table (several)."""
    args = parser().parse_args(argv)
    from vitplast_tune import workflows
    from vitplast_tune.records.result import summary

    if args.storage:
        outputs.existing_dir(args.storage, "--storage")
    if args.out:
        outputs.output_dir(args.out, "--out")
    if len(args.name) == 1:
        print(summary(workflows.reanalyze(args.name[0], args.storage, args.tracking_uri, criteria=args.criteria)))
    else:
        print(workflows.compare_datasets(args.name, args.storage, args.out))
    return 0


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast analyze`` (and its alias ``vitplast-analyze``)."""
    run_main(lambda: analyze_main(argv))
