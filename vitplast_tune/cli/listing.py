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
    """One search as a line: ``name  status  ended/trials trials  best ...`` (an unreadable one: why)."""
    if said["status"] == UNREADABLE:
        return f"{said['name']}  {UNREADABLE}: {said['error']}"
    best = said["best"]
    top = f"  best {best['components']} {100 * best['best_val_acc']:.2f}%" if best and best.get("best_val_acc") else ""
    return f"{said['name']}  {said['status']}  {said['ended']}/{said['trials']} trials{top}"


def list_main(argv: Sequence[str] | None = None) -> int:
    """Print the searches of a storage, a line each (or JSON)."""
    args = parser().parse_args(argv)
    from vitplast_tune.records.search import list_searches, load_search

    found = [_described(name, args.storage, load_search) for name in list_searches(args.storage)]
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        print("\n".join(map(line, found)) if found else "no search recorded here")
    return 0


UNREADABLE = "unreadable"


def _described(name: str, storage: str | None, load_search) -> dict:
    """Where search ``name`` stands (``Search.describe``); a search whose records cannot be read is said so, with
    why, and does not hide the others."""
    from vitplast_tune.errors import UserError

    try:
        return load_search(name, storage).describe()
    except UserError as exc:  # a damaged record, trial table or store: the message names it and what to do
        return {"name": name, "status": UNREADABLE, "error": str(exc)}
    except Exception as exc:  # anything else a damaged file makes a library raise: one line too
        said = " ".join(str(exc).split())[:300]
        return {"name": name, "status": UNREADABLE, "error": f"{type(exc).__name__}: {said}; vitplast status {name}"}


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast list``."""
    run_main(lambda: list_main(argv))
