"""``vitplast ui NAME``: open a search's runs in the MLflow UI (started on its store, bound to 127.0.0.1)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NoReturn

from vitplast_tune.cli.base import Parser, positive_int, run_main

HELP = "Open a search's runs (or several searches' in one view) in the MLflow UI, served on 127.0.0.1."
UI_HELP = """Open a search's runs in the MLflow UI: start the UI on the search's tracking store (bound to 127.0.0.1) and
print the link to its view (and to its best trial's run); Ctrl-C stops it. A search that recorded to an MLflow server
only gets its links printed. Several names: one view of all their trials, each with its search's name (the searches
must share a tracking store and experiment, as searches in one storage do by default).

    vitplast ui quickstart --open
    vitplast ui quickstart subsets-big"""


def parser() -> Parser:
    """The arguments of ``vitplast ui``."""
    p = Parser(prog="vitplast ui", description=UI_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="+", help="the search's name (its --name); several: one view comparing them")
    p.add_argument("--storage", help="where the search's results lie; default ~/vitplast_tune_results")
    p.add_argument("--port", type=positive_int, default=5000, help="the UI's port on 127.0.0.1 (default: 5000)")
    p.add_argument("--open", action="store_true", help="open the view in the default web browser")
    return p


def ui_main(argv: Sequence[str] | None = None) -> int:
    """Serve a search's MLflow store and print (with --open, open) the link to its view."""
    args = parser().parse_args(argv)
    from vitplast_tune.plan import services
    from vitplast_tune.records import ui
    from vitplast_tune.storage import SEARCH_FILE, read_record, search_dir

    for name in args.name:  # each store checked first: a damaged one is named, with what to do
        record = read_record(search_dir(name, args.storage), purpose="recorded")
        if not record["tracking_uri"].startswith(("http://", "https://")):  # a server's answer is checked by its links
            services.check_tracking(record["tracking_uri"], f"the search's record {name}/{SEARCH_FILE}")
    return ui.serve(args.name, args.storage, args.port, args.open)


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast ui`` (and its alias ``vitplast-ui``)."""
    run_main(lambda: ui_main(argv))
