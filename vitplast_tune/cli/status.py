"""``vitplast status NAME``: where one search stands, finished or running: its trials finished, pruned and failed,
what is left, the best so far and the time it has taken (``--json`` for scripts); no Ray started."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NoReturn

from vitplast_tune.cli.base import Parser, run_main

HELP = "Say where a search stands: trials finished, pruned, failed and left, the best so far, elapsed (--json)."


def parser() -> Parser:
    """The arguments of ``vitplast status``."""
    p = Parser(prog="vitplast status", description=HELP)
    p.add_argument("name", help="the search's name (its --name)")
    p.add_argument(
        "--storage", help="where the search lies; default: VITPLAST_RESULTS_DIR, else ~/vitplast_tune_results"
    )
    p.add_argument("--json", action="store_true", help="the same as one JSON object, for scripts")
    return p


def text(said: dict) -> str:
    """The status as a person reads it."""
    lines = [
        f"Search {said['name']}: {said['status']}, {said['ended']} of {said['trials']} trials ended "
        f"({said['finished']} finished, {said['pruned']} pruned, {said['failed']} failed), {said['left']} left"
    ]
    if (best := said["best"]) and best.get("best_val_acc") is not None:
        lr = f" at lr {best['lr']:.3g}" if isinstance(best.get("lr"), (int, float)) else ""
        lines.append(f"Best so far: {best['components']}{lr}, {100 * best['best_val_acc']:.2f}% validation accuracy")
    if said["elapsed_s"] is not None:
        lines.append(f"Elapsed: {said['elapsed_s'] / 60:.1f} min")
    return "\n".join(lines)


def status_main(argv: Sequence[str] | None = None) -> int:
    """Print where a search stands (or the same as JSON)."""
    args = parser().parse_args(argv)
    from vitplast_tune.records.search import load_search

    said = load_search(args.name, args.storage).describe()
    print(json.dumps(said, indent=2) if args.json else text(said))
    return 0


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast status``."""
    run_main(lambda: status_main(argv))
