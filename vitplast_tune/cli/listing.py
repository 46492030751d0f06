"""``vitplast list``: the searches a storage holds, each with where it stands (``--json`` for scripts)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NoReturn

from vitplast_tune.cli.base import Parser, run_main

HELP = "List the searches recorded in a storage, each with its status, trials and best so far (--json for scripts)."


def parser() -> Parser:
    """The arguments of ``vitplast list``."""
    p = Parser(prog="vitplast list", description=HELP)
    p.add_argument(
        "--storage", help="where the searches lie; default: VITPLAST_RESULTS_DIR, else ~/vitplast_tune_results"
    )
    p.add_argument("--json", action="store_true", help="one JSON list of the searches, for scripts")
    return p


def line(said: dict) -> str:
    """One search as a line: ``name  status  ended/trials trials  best ...``."""
    best = said["best"]
    top = f"  best {best['components']} {100 * best['best_val_acc']:.2f}%" if best and best.get("best_val_acc") else ""
    return f"{said['name']}  {said['status']}  {said['ended']}/{said['trials']} trials{top}"


def list_main(argv: Sequence[str] | None = None) -> int:
    """Print the searches of a storage, a line each (or JSON)."""
    args = parser().parse_args(argv)
    from vitplast_tune.records.search import list_searches, load_search

    found = [load_search(name, args.storage).describe() for name in list_searches(args.storage)]
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        print("\n".join(map(line, found)) if found else "no search recorded here")
    return 0


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast list``."""
    run_main(lambda: list_main(argv))
