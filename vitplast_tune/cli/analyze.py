"""``vitplast analyze``: analyze finished searches again (one: the summary; several: the paper's cross-dataset
table)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from vitplast_tune import output_paths
from vitplast_tune.cli.base import Parser, print_json, run_main
from vitplast_tune.errors import UserError

HELP = "Analyze finished searches again: correlations and plots logged to MLflow, or a cross-dataset table."


def parser() -> Parser:
    """The arguments of ``vitplast analyze``."""
    p = Parser(prog="vitplast analyze", description=HELP)
    p.add_argument("--name", action="append", required=True, help="a search's name; repeat for several datasets")
    p.add_argument("--storage", help="where the searches' results lie; default ~/vitplast_tune_results")
    p.add_argument("--tracking-uri", help="MLflow tracking URI; default: the one the search used")
    p.add_argument("--criteria", action="store_true", help="also the criteria lab: pre-training predictors per subset")
    p.add_argument("--out", help="where the cross-dataset files go; default <storage>/cross-<names>")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the text, for scripts")
    return p


def analyze_main(argv: Sequence[str] | None = None) -> int:
    """Analyze finished searches again and print the summary (one --name, kept in its folder as printed) or the
    cross-dataset table (several)."""
    args = parser().parse_args(argv)
    from vitplast_tune import workflows
    from vitplast_tune.records.printed import keep_summary

    twice = sorted({n for n in args.name if args.name.count(n) > 1})
    if twice:
        raise UserError(f"--name {twice[0]} is given {args.name.count(twice[0])} times; name each search once")
    if args.storage:
        output_paths.existing_dir(args.storage, "--storage")
    if args.out:
        output_paths.output_dir(args.out, "--out")
    if len(args.name) == 1:
        result = workflows.reanalyze(args.name[0], args.storage, args.tracking_uri, criteria=args.criteria)
        print_json(as_json(result)) if args.json else print(keep_summary(result))
    elif args.json:
        gains, agreement, out = workflows.cross_dataset(args.name, args.storage, args.out)
        print_json({"names": args.name, "gains": gains, "agreement": agreement, "files": str(out)})
    else:
        print(workflows.compare_datasets(args.name, args.storage, args.out))
    return 0


def as_json(result) -> dict:
    """What ``analyze --json`` prints of one search: its name, trials, the answer's numbers, the correlations, files."""
    from vitplast_tune.records.answer import answer_of

    analysis = result.analysis.trials if result.analysis is not None else None
    return {
        "name": result.place.name,
        "trials": len(result.trials),
        "answer": answer_of(result.trials),
        "correlations": analysis.correlations if analysis is not None else [],
        "results_dir": str(result.place.results_dir),
        "parent_run_id": result.parent_run_id,
    }


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast analyze`` (and its alias ``vitplast-analyze``)."""
    run_main(lambda: analyze_main(argv))
