"""``vitplast search``: run (or resume) a Ray Tune search over which ViT components to finetune, or describe its
plan with ``--dry-run``. Its flags, their help and their defaults are made from ``SearchOptions``' fields (one
definition of every option, which ``run_search``'s keywords share); the trial options' defaults read from the space
file, else ``FinetuneConfig``."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from vitplast_tune.cli.base import Parser, quiet_library, run_main

HELP = "Run a Ray Tune search over which ViT components to finetune (e.g. --space component_subsets)."


def parser() -> argparse.ArgumentParser:
    """The arguments of ``vitplast search``: one flag per field of ``SearchOptions``, in its groups, and ``--dry-run``.

    Returns:
        The parser; a flag not given is absent from what it parses (``SearchOptions``' default then holds).
    """
    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.plan.options import GROUPS, TRIAL_SETTINGS, SearchOptions

    defaults, trial = SearchOptions(), FinetuneConfig()
    p = Parser(prog="vitplast search", description=HELP, argument_default=argparse.SUPPRESS)
    groups = {key: p.add_argument_group(title) for key, title in GROUPS.items()}
    for f in dataclasses.fields(SearchOptions):
        meta = f.metadata
        flag = meta["flag"] or f"--{f.name.replace('_', '-')}"
        if f.name in TRIAL_SETTINGS and hasattr(trial, f.name) and getattr(trial, f.name) is not None:
            said = f"; default: the space file's, else {getattr(trial, f.name)}"
        else:
            said = _default_text(getattr(defaults, f.name), meta["argparse"].get("action"))
        groups[meta["group"]].add_argument(flag, dest=f.name, help=meta["help"] + said, **meta["argparse"])
        if f.name == "verbose":
            groups["search"].add_argument(
                "--verbose",
                dest="verbose",
                action="store_const",
                const=2,
                help="more on stderr: the library's DEBUG messages and Ray's and MLflow's start-up notices (as "
                "VITPLAST_LOG_LEVEL=DEBUG does)",
            )
            groups["search"].add_argument(
                "--dry-run",
                action="store_true",
                default=False,
                help="validate everything, print the trials, resources, concurrency and an estimated wall time from "
                "a few training steps timed here, and exit without starting Ray",
            )
    return p


def _default_text(value: Any, action: str | None) -> str:
    """`` (default: X)`` for an option whose default is a value worth saying."""
    if value is None or action in ("store_true", "store_false", "store_const", "append") or value in ({}, ()):
        return ""
    return f" (default: {value:g})" if isinstance(value, float) else f" (default: {value})"


def options_of(args: argparse.Namespace):
    """The ``SearchOptions`` the parsed flags give (the flags not given keep their defaults)."""
    from vitplast_tune.plan.options import SearchOptions

    given = {k: v for k, v in vars(args).items() if k != "dry_run"}
    return SearchOptions(**given)


def search_main(argv: Sequence[str] | None = None) -> int:
    """Run (or resume) a search from command-line arguments and print its summary, kept in its folder as printed."""
    started = time.perf_counter()
    args = parser().parse_args(argv)
    from vitplast_tune.timings import Timings

    timings = Timings({"imports": time.perf_counter() - started})
    options = options_of(args)
    quiet_library(options.verbose == 0, options.verbose >= 2)
    if args.dry_run:
        from vitplast_tune.workflows.preview import dry_run

        print(dry_run(options))
        return 0
    from vitplast_tune.records.printed import keep_summary
    from vitplast_tune.run import driver

    print(keep_summary(driver.run(options, timings=timings)))
    return 0


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast search`` (and its alias ``vitplast-search``)."""
    run_main(lambda: search_main(argv))
