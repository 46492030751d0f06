"""``vitplast lab``: the criteria lab on offline tasks (``lab``, driven by ``workflows.lab``): list the tasks, check
which qualify, run or analyze one task's lab, run a pre-registered set of labs, and pool labs into one verdict; every
stage resumes when the same command runs again."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from vitplast_tune.cli.base import Parser, quiet_library, run_main
from vitplast_tune.errors import SearchInterrupted, UserError

COMMANDS = ("tasks", "check", "run", "analyze", "registered", "progress", "pooled")
HELP = "The criteria lab on offline tasks: which tasks qualify, each task's lab, the verdict pooled across them."
LAB_HELP = """The criteria lab on offline tasks, each task's lab a few resumable searches in <storage>/lab.<model>.<task>:

    vitplast lab tasks                                  # the tasks and models
    vitplast lab check [--task T ...] [--model M ...]   # which tasks qualify (full finetuning and single components)
    vitplast lab run TASK [--model M]                   # one task's whole lab, then its analysis
    vitplast lab analyze TASK [--model M]               # the analysis of a lab's finished stages again
    vitplast lab registered --preregistration FILE --storage DIR [--resume] [--restore-from FOLDER]
                                                        # the checks and labs a pre-registration names
    vitplast lab progress --storage DIR [--page FILE]   # where a registered run stands (Markdown)
    vitplast lab pooled --name NAME LAB [LAB ...]       # the verdict pooled across labs (lab.<model>.<task> names)
    vitplast lab analyze --from FOLDER [--design FILE]  # a kept lab re-analysed from its folder alone
    vitplast lab pooled --from FOLDER ... --out DIR [--design FILE] [--tracking-uri URI]  # the pre-registered verdict

Running the same command again goes on where it stopped (registered: with --resume). --dry-run estimates check and
run without training."""


def parser() -> Parser:
    """The arguments of ``vitplast lab``."""
    from vitplast_tune.lab.tasks import DEFAULT_SPACE, MAX_ROUNDS

    p = Parser(prog="vitplast lab", description=LAB_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=COMMANDS, help="what to do: " + ", ".join(COMMANDS))
    p.add_argument("labs", nargs="*", help="run/analyze: the task; pooled: the labs (lab.<model>.<task>)")
    p.add_argument("--task", action="append", help="check: a task (repeatable; default: every task)")
    p.add_argument("--model", action="append", help="a model, s0 or s1 (repeatable for check; default: s0)")
    p.add_argument("--name", help="pooled: the name of the pooled verdict (a folder under --storage)")
    p.add_argument("--storage", help="where the labs live (default ~/vitplast_tune_results)")
    p.add_argument(
        "--from", dest="kept", nargs="+", metavar="FOLDER", help="analyze/pooled: kept lab folders (docs/results/data)"
    )
    p.add_argument("--design", help="with --from: the pre-registration (default: preregistration.yaml beside them)")
    p.add_argument("--out", help="pooled --from: the folder for pooled.json, its tables and forest plots")
    p.add_argument("--tracking-uri", help="pooled --from: also log the verdict as an MLflow run there")
    p.add_argument("--space", help=f"the lab space (default: {DEFAULT_SPACE})")
    p.add_argument("--max-rounds", type=int, help=f"extension rounds beyond the grid's rates (default: {MAX_ROUNDS})")
    p.add_argument("--cpus-per-trial", type=float, default=1.0, help="CPUs per trial (default: 1)")
    p.add_argument(
        "--even-if-unqualified", action="store_true", help="run: the whole lab even on a task that fails the check"
    )
    p.add_argument("--preregistration", help="registered: the pre-registration file (its design is what runs)")
    p.add_argument("--resume", action="store_true", help="registered: continue the run in --storage")
    p.add_argument(
        "--restore-from",
        metavar="FOLDER",
        help="registered: checks and labs kept on an earlier machine (docs/results/data/lab-v2), read, not trained again",
    )
    p.add_argument("--page", help="progress: the Markdown page whose progress block to replace (default: print it)")
    p.add_argument("--dry-run", action="store_true", help="check/run: estimate the time, train nothing")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def lab_main(argv: Sequence[str] | None = None) -> int:
    """List the tasks, check them, run or analyze a lab, or pool labs. An interrupted stage says to run the same
    command again, which resumes it."""
    args = parser().parse_intermixed_args(argv)
    quiet_library(args.quiet)
    try:
        return _dispatch(args)
    except SearchInterrupted as exc:
        again = "the same vitplast lab command again continues the lab where it stopped (the stage is resumed)"
        if args.command == "registered":  # a registered run's record exists now: only --resume continues it
            again = "the same vitplast lab registered command with --resume continues the run where it stopped"
        raise SearchInterrupted(f"{str(exc).split('; nothing is lost')[0]}; {again}", exc.exit_code) from None


def _dispatch(args: argparse.Namespace) -> int:
    from vitplast_tune import output_paths
    from vitplast_tune.lab import tasks
    from vitplast_tune.storage import default_storage

    if args.kept:
        return _from_kept(args)
    storage = output_paths.output_dir(args.storage, "--storage") if args.storage else default_storage()
    models = args.model or ["s0"]

    def make(task: str, model: str) -> tasks.Lab:
        space, rounds = (
            args.space or tasks.DEFAULT_SPACE,
            tasks.MAX_ROUNDS if args.max_rounds is None else args.max_rounds,
        )
        return tasks.Lab(task, model, storage, space, rounds, args.cpus_per_trial, 0 if args.quiet else 1)

    if args.command == "tasks":
        print(
            "\n".join(
                [f"{t:<28} {d}" for t, d in tasks.TASKS.items()] + [f"model {k}: {v}" for k, v in tasks.MODELS.items()]
            )
        )
        return 0
    if args.command == "pooled":
        from vitplast_tune.lab import report

        if not args.name or not args.labs:
            raise UserError("pooled needs --name NAME and the labs to pool (lab.<model>.<task> names)")
        dirs = [storage / name for name in args.labs]
        _, text = report.pool_folders(
            dirs, storage / args.name, design=args.design, include_unqualified=args.even_if_unqualified
        )
        print(text)
        return 0
    if args.command == "registered":
        return _registered(args, storage)
    if args.command == "progress":
        from vitplast_tune.lab.progress import RUN_FILE, progress_markdown, write_into_page

        if not args.storage or not (storage / RUN_FILE).is_file():
            raise UserError(f"progress needs --storage DIR holding a registered run ({RUN_FILE})")
        if args.page:
            write_into_page(Path(args.page), progress_markdown(storage))
        else:
            print(progress_markdown(storage), end="")
        return 0
    if args.command == "check":
        return _check(args, [make(t, m) for m in models for t in (args.task or tasks.TASKS)])
    if len(args.labs) != 1:
        raise UserError(f"{args.command} takes one task, e.g. vitplast lab {args.command} digits_c-contrast")
    return _run(args, make(args.labs[0], models[0]))


def _registered(args: argparse.Namespace, storage) -> int:
    """``registered``: the checks and labs of a pre-registration, in --storage (new, or continued with --resume)."""
    from vitplast_tune.lab.preregistration import read_preregistration
    from vitplast_tune.workflows import preregistered_labs

    if not args.preregistration or not args.storage:
        raise UserError("registered needs --preregistration FILE and --storage DIR (where the run lives)")
    if args.labs or args.task or args.model or args.space or args.max_rounds is not None or args.dry_run:
        raise UserError(
            "registered takes no tasks, --task, --model, --space, --max-rounds or --dry-run: the pre-registration"
            " names the design"
        )
    prereg = read_preregistration(args.preregistration)
    restore = Path(args.restore_from) if args.restore_from else None
    settings = preregistered_labs.RunSettings(storage, args.cpus_per_trial, 0 if args.quiet else 1, restore)
    preregistered_labs.restorable(prereg, restore)  # refused before anything is written
    record = preregistered_labs.start_or_resume(prereg, settings, resume=args.resume)  # refused before Ray starts
    record = preregistered_labs.run_registered(prereg, settings, record=record)
    print(preregistered_labs.describe_run(record))
    return 0


def _from_kept(args: argparse.Namespace) -> int:
    """``analyze --from FOLDER`` and ``pooled --from FOLDER ...``: kept labs re-analysed from their folders alone."""
    from pathlib import Path

    from vitplast_tune import output_paths
    from vitplast_tune.lab import report

    if args.command not in ("analyze", "pooled") or args.labs:
        raise UserError("--from goes with analyze (one folder) or pooled (the folders), and no lab names")
    folders = [Path(f) for f in args.kept]
    missing = [f for f in folders if not f.is_dir()]
    if missing:
        raise UserError(f"--from: no folder {missing[0]}")
    if args.command == "analyze":
        if len(folders) != 1:
            raise UserError("analyze --from takes one lab folder")
        print(report.analyze_folder(folders[0], args.design))
        return 0
    if not args.out:
        raise UserError("pooled --from needs --out DIR (where pooled.json, its tables and forest plots go)")
    out = output_paths.output_dir(args.out, "--out")
    _, text = report.pool_folders(
        folders, out, design=args.design, tracking_uri=args.tracking_uri, include_unqualified=args.even_if_unqualified
    )
    print(text)
    return 0


def _check(args: argparse.Namespace, found: list) -> int:
    """``check``: each lab's qualification stages (or, with --dry-run, their estimated time) and the table."""
    from vitplast_tune.lab.estimate import describe_estimates
    from vitplast_tune.lab.qualify import describe_qualifications
    from vitplast_tune.lab.stages import check_lab
    from vitplast_tune.workflows import lab as driver

    if args.dry_run:
        print(describe_estimates([driver.estimate(lab, qualify_only=True) for lab in found]))
        return 0
    for lab in found:
        check_lab(lab)  # before Ray starts, nothing written
    with driver.ray_session():
        checked = [driver.qualify(lab) for lab in found]
    print(describe_qualifications(checked))
    return 0


def _run(args: argparse.Namespace, lab) -> int:
    """``run`` and ``analyze``: one task's lab (or, with --dry-run, its estimated time), then its report."""
    from vitplast_tune.lab.estimate import describe_estimates
    from vitplast_tune.lab.stages import check_lab
    from vitplast_tune.workflows import lab as driver

    if args.dry_run:
        print(describe_estimates([driver.estimate(lab)]))
        return 0
    if args.command == "analyze":
        results = driver.analyze_lab(lab)
    else:
        check_lab(lab)  # before Ray starts, nothing written
        with driver.ray_session():
            found, results = driver.run_lab(lab, even_if_unqualified=args.even_if_unqualified)
        if results is None:
            print(f"{lab.name}: {found.reason}; not run further (--even-if-unqualified runs it anyway)")
            return 0
    print(driver.describe_report(lab, results))
    return 0


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast lab`` (and its alias ``vitplast-lab``)."""
    run_main(lambda: lab_main(argv))
