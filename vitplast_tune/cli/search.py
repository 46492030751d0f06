"""``vitplast search``: run (or resume) a Ray Tune search over which ViT components to finetune, or describe its
plan with ``--dry-run``; the flags' defaults read from ``SearchOptions`` and ``FinetuneConfig``."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from vitplast_tune.cli.base import Parser, quiet_library, run_main
from vitplast_tune.config import PAPER_MODEL, PLASTICITY_VARIANTS, PRECISIONS
from vitplast_tune.errors import UserError

HELP = "Run a Ray Tune search over which ViT components to finetune (e.g. --space component_subsets)."


def parser() -> argparse.ArgumentParser:
    """The arguments of ``vitplast search``; defaults read from SearchOptions and FinetuneConfig."""
    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.plan.options import SearchOptions

    run, train = SearchOptions(), FinetuneConfig()
    p = Parser(prog="vitplast search", description=HELP)
    _search_flags(p, run)
    _trial_flags(p, train)
    _where_flags(p, run)
    _plasticity_flags(p, run)
    return p


def _search_flags(parser: argparse.ArgumentParser, run) -> None:
    """Which search: its space, name, size and seed; resuming it."""
    p = parser.add_argument_group("the search")
    from vitplast_tune.plan.options import DEFAULT_SEED

    p.add_argument(
        "--space",
        default=run.space,
        help=f"space file: a shipped name (see the README) or a path to a .yaml file (default: {run.space})",
    )
    p.add_argument("--name", help="search name (the MLflow parent run and the results folder); default: <space>-<date>")
    p.add_argument(
        "--resume", action="store_true", help="continue the interrupted search --name, with its recorded settings"
    )
    p.add_argument(
        "--num-samples", type=int, help="number of trials (a grid: repeats of the grid); default: the space file's"
    )
    p.add_argument(
        "--seed",
        type=int,
        help=f"seed of the search algorithm, and the training seed unless the space sets one (default: {DEFAULT_SEED})",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines while trials run")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate everything, print the trials, resources, concurrency and an estimated wall time from a few "
        "training steps timed here, and exit without starting Ray",
    )


def _trial_flags(parser: argparse.ArgumentParser, train) -> None:
    """What every trial does (the space file's defaults otherwise): model, data, steps."""
    p = parser.add_argument_group("what every trial does (default: the space file's defaults)")
    space_default = "the space file's, else {}"
    p.add_argument(
        "--max-steps", type=int, help=f"training steps per trial; default: {space_default.format(train.max_steps)}"
    )
    p.add_argument(
        "--budgets",
        type=int,
        nargs="+",
        metavar="STEPS",
        help="a grid at several step budgets, analyzed apart (e.g. --budgets 150 1000); the i-th replaces the "
        "space's i-th budget and keeps what it narrows; default: the space's budgets",
    )
    p.add_argument(
        "--batch-size", type=int, help=f"training batch size; default: {space_default.format(train.batch_size)}"
    )
    p.add_argument(
        "--eval-every",
        type=int,
        help=f"evaluate and report every N steps; default: {space_default.format(train.eval_every)}",
    )
    p.add_argument(
        "--model",
        help=f"timm model name, e.g. {PAPER_MODEL} (the paper's), or hf:<hub id or folder> (transformers; "
        f"docs/models.md); default: {space_default.format(train.model)}",
    )
    p.add_argument("--weights", help="local weights for --model (safetensors or torch state dict), instead of the hub")
    p.add_argument(
        "--dataset",
        help="digits (offline default), cifar10, cifar100, pets, flowers102, cifar10c:<corruption>, imagefolder",
    )
    p.add_argument("--data-dir", help="where the dataset lies (default ~/.cache/vitplast_tune/data)")
    p.add_argument(
        "--download", action="store_true", default=None, help="download the dataset when missing (needs a network)"
    )
    p.add_argument(
        "--augment",
        help="training augmentation: paper (RandomResizedCrop 8-100%% + flip), light (RandomResizedCrop 80-100%%, "
        "no flip), none; default: the space file's, else the dataset's (paper for natural images, light for digits "
        "and fractals)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="auto: bf16 where the GPU supports it, else fp16 with a gradient scaler on CUDA, fp32 on CPU; "
        f"default: {space_default.format(train.precision)}",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any trial setting (a FinetuneConfig field), parsed by its type: --set weight_decay=0.05 "
        "--set compile=true --set blocks=9,10,11 --set weights=none; repeatable; overrides the space file",
    )


def _where_flags(parser: argparse.ArgumentParser, run) -> None:
    """Where trials run and results go: storage, MLflow, the Ray cluster, resources per trial, retries."""
    p = parser.add_argument_group("where trials run and results go")
    from vitplast_tune.plan.options import DEFAULT_MAX_FAILURES

    p.add_argument(
        "--storage", help="Ray Tune results: a local directory or a URI (s3://, gs://); default ~/vitplast_tune_results"
    )
    p.add_argument(
        "--tracking-uri", help="MLflow tracking URI; default: MLFLOW_TRACKING_URI, else sqlite:///<storage>/mlflow.db"
    )
    from vitplast_tune.plan.options import EXPERIMENT

    p.add_argument(
        "--experiment",
        help=f"MLflow experiment of the search's runs; default: MLFLOW_EXPERIMENT_NAME, else {EXPERIMENT}",
    )
    p.add_argument(
        "--address",
        help="join this Ray cluster (e.g. ray://host:10001 or auto); default: RAY_ADDRESS, else a local Ray instance",
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=run.connect_timeout_s,
        metavar="SECONDS",
        help=f"with --address: how long to wait for the cluster's head to answer (default: {run.connect_timeout_s:g})",
    )
    _resource_flags(p, run)
    p.add_argument(
        "--max-concurrent", type=int, help="most trials running at once; default: as many as resources allow"
    )
    p.add_argument(
        "--max-failures",
        type=int,
        help=f"retries of a trial that crashes, from its last checkpoint; applies to a resumed search's remaining trials (default: {DEFAULT_MAX_FAILURES})",
    )


def _resource_flags(p, run) -> None:
    """The resources of one trial: CPUs, GPUs, data-parallel workers, custom Ray resources."""
    p.add_argument(
        "--cpus-per-trial",
        type=float,
        default=run.cpus_per_trial,
        help=f"CPUs reserved per trial, also its torch threads (default: {run.cpus_per_trial:g})",
    )
    p.add_argument(
        "--gpus-per-trial",
        type=float,
        default=run.gpus_per_trial,
        help=f"GPUs per trial; fractions such as 0.5 share a GPU, 2 or more train data-parallel (DDP), one worker per GPU "
        f"(default: {run.gpus_per_trial:g})",
    )
    p.add_argument(
        "--workers-per-trial",
        type=int,
        default=run.workers_per_trial,
        help="data-parallel workers per trial (a Ray Train run of torch DDP), each with its share of the trial's CPUs "
        "and GPUs (default: one per GPU of --gpus-per-trial; docs/guide/many-gpus.md)",
    )
    p.add_argument(
        "--placement",
        choices=("pack", "spread"),
        default=run.placement,
        help="where a trial's workers run: pack them on as few nodes as hold them, or spread them over nodes "
        f"(default: {run.placement})",
    )
    p.add_argument(
        "--resources-per-trial",
        type=json.loads,
        default={},
        help="custom Ray resources per trial, as JSON, e.g. '{\"a100\": 1}'",
    )


def _plasticity_flags(parser: argparse.ArgumentParser, run) -> None:
    """The plasticity measured before training and correlated with accuracy after it."""
    p = parser.add_argument_group("plasticity")
    p.add_argument(
        "--no-plasticity", action="store_true", help="skip measuring plasticity and its correlation with accuracy"
    )
    p.add_argument(
        "--plasticity-variant",
        default=run.plasticity_variant,
        choices=PLASTICITY_VARIANTS,
        help="paper: every component applied to the embedding output (the paper's definition, default); in_network: real inputs",
    )
    p.add_argument(
        "--plasticity-reference",
        default=run.plasticity_reference,
        help=f"reference dataset paired with the downstream test split (default: {run.plasticity_reference}; the paper uses ImageNet val)",
    )
    p.add_argument(
        "--plasticity-pairs", type=int, help="most image pairs for plasticity (the paper uses 12,800); default: all"
    )


def search_main(argv: Sequence[str] | None = None) -> int:
    """Run (or resume) a search from command-line arguments and print its summary."""
    started = time.perf_counter()
    args = parser().parse_args(argv)
    from vitplast_tune.plan.options import SearchOptions
    from vitplast_tune.timings import Timings

    timings = Timings({"imports": time.perf_counter() - started})

    settings = trial_settings(args)
    if not isinstance(args.resources_per_trial, dict):
        raise UserError("--resources-per-trial must be a JSON object such as '{\"a100\": 1}'")
    options = SearchOptions(
        space=args.space,
        name=args.name,
        storage=args.storage,
        tracking_uri=args.tracking_uri,
        experiment=args.experiment,
        address=args.address,
        connect_timeout_s=args.connect_timeout,
        num_samples=args.num_samples,
        budgets=tuple(args.budgets) if args.budgets else None,
        cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial,
        workers_per_trial=args.workers_per_trial,
        placement=args.placement,
        resources_per_trial=args.resources_per_trial,
        max_concurrent=args.max_concurrent,
        seed=args.seed,
        resume=args.resume,
        max_failures=args.max_failures,
        settings=settings,
        verbose=0 if args.quiet else 1,
        plasticity=not args.no_plasticity,
        plasticity_variant=args.plasticity_variant,
        plasticity_reference=args.plasticity_reference,
        plasticity_pairs=args.plasticity_pairs,
    )
    quiet_library(args.quiet)
    if args.dry_run:
        from vitplast_tune.workflows.preview import dry_run

        print(dry_run(options))
        return 0
    from vitplast_tune.records.result import summary
    from vitplast_tune.run import driver

    print(summary(driver.run(options, timings=timings)))
    return 0


DEDICATED = (
    "model",
    "weights",
    "dataset",
    "data_dir",
    "download",
    "augment",
    "max_steps",
    "batch_size",
    "eval_every",
    "precision",
)


def trial_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The trial settings the command line gives: its dedicated flags that were given, then each ``--set KEY=VALUE``
    (typed by the field); the same key given two ways with two values is a UserError."""
    from vitplast_tune.config import parse_setting

    settings = {key: getattr(args, key) for key in DEDICATED if getattr(args, key) is not None}
    flags = set(settings)
    for text in args.set:
        key, value = parse_setting(text)
        if key in flags and settings[key] != value:
            flag = f"--{key.replace('_', '-')}"
            raise UserError(f"--set {text} contradicts {flag} {settings[key]}; give the setting once")
        settings[key] = value
    return settings


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast search`` (and its alias ``vitplast-search``)."""
    run_main(lambda: search_main(argv))
