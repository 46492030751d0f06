"""The command line: each command's arguments and main (``vitplast-search``, ``vitplast-analyze``,
``vitplast-plasticity``, ``vitplast-pretrain``, ``vitplast-recommend``, ``vitplast-ui``; ``python -m vitplast_tune COMMAND`` and
``scripts/*.py`` call the same functions), and turning
a UserError into one line on stderr and exit code 2.

Heavy modules (Ray, torch, timm) are imported inside the mains, so ``--help`` and bad flags answer at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from vitplast_tune import outputs, storage
from vitplast_tune.config import PLASTICITY_VARIANTS, PRECISIONS, TESTBED_MODEL, TESTBED_WEIGHTS, PretrainConfig
from vitplast_tune.errors import SearchInterrupted, UserError

SEARCH_HELP = "Run a Ray Tune search over which ViT components to finetune: vitplast-search --space component_subsets"
ANALYZE_HELP = (
    "Analyze a finished search again: plasticity vs accuracy correlations and plots, logged to its MLflow parent run."
)
PLASTICITY_HELP = """Measure the plasticity of every ViT component between a reference distribution and a downstream test split.

Writes the per-layer table (CSV + JSON) and a plot, and prints the per-component ranking.
The paper pairs ImageNet val with the downstream test split; offline, the reference is the
project's fractal distribution (the testbed's pretraining data).
"""
PRETRAIN_HELP = """Pretrain the offline testbed ViT on generated fractals and write the shipped checkpoint.

    vitplast-pretrain      # writes vitplast_tune/weights/vit_testbed_patch8_32.fractal.safetensors (+ .json)
"""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose mistakes are one line on stderr, ``error: <prog>: <message> (see --help)``, exit 2."""

    def error(self, message: str) -> NoReturn:
        """Print the mistake on one line and exit with code 2 (argparse prints the whole usage first)."""
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """Call ``main()`` and exit with its code; a UserError prints ``error: <message>`` and exits 2, an interrupted
    search exits 130 (Ctrl-C) or 143 (SIGTERM)."""
    try:
        code = main()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except SearchInterrupted as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)  # 130 after Ctrl-C, 143 after SIGTERM
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


# ----------------------------------------------------------------------------- vitplast-search


def search_parser() -> argparse.ArgumentParser:
    """The arguments of ``vitplast-search``; defaults read from SearchOptions and FinetuneConfig."""
    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.search.plan import SearchOptions

    run, train = SearchOptions(), FinetuneConfig()
    p = Parser(description=SEARCH_HELP)
    _search_flags(p, run)
    _trial_flags(p, train)
    _where_flags(p, run)
    _plasticity_flags(p, run)
    return p


def _search_flags(parser: argparse.ArgumentParser, run) -> None:
    """Which search: its space, name, size and seed; resuming it."""
    p = parser.add_argument_group("the search")
    from vitplast_tune.search.plan import DEFAULT_SEED

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
        help=f"timm model name, e.g. vit_base_patch16_224.augreg_in21k; default: {space_default.format(train.model)}",
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
    from vitplast_tune.search.plan import DEFAULT_MAX_FAILURES

    p.add_argument(
        "--storage", help="Ray Tune results: a local directory or a URI (s3://, gs://); default ~/vitplast_tune_results"
    )
    p.add_argument(
        "--tracking-uri", help="MLflow tracking URI; default: MLFLOW_TRACKING_URI, else sqlite:///<storage>/mlflow.db"
    )
    from vitplast_tune.search.plan import EXPERIMENT

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
        help=f"GPUs per trial; fractions such as 0.5 share a GPU (default: {run.gpus_per_trial:g})",
    )
    p.add_argument(
        "--resources-per-trial",
        type=json.loads,
        default={},
        help="custom Ray resources per trial, as JSON, e.g. '{\"a100\": 1}'",
    )
    p.add_argument(
        "--max-concurrent", type=int, help="most trials running at once; default: as many as resources allow"
    )
    p.add_argument(
        "--max-failures",
        type=int,
        help=f"retries of a trial that crashes, from its last checkpoint; applies to a resumed search's remaining trials (default: {DEFAULT_MAX_FAILURES})",
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
    args = search_parser().parse_args(argv)
    from vitplast_tune.search.plan import SearchOptions
    from vitplast_tune.search.timings import Timings

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
    if args.dry_run:
        from vitplast_tune.search.estimate import dry_run

        print(dry_run(options))
        return 0
    from vitplast_tune.search import driver, results

    print(results.summary(driver.run(options, timings=timings)))
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


def search(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast-search``."""
    run_main(lambda: search_main(argv))


# ----------------------------------------------------------------------------- vitplast-analyze


def analyze_main(argv: Sequence[str] | None = None) -> int:
    """Analyze finished searches again and print the summary (one --name) or the cross-dataset table (several)."""
    p = Parser(description=ANALYZE_HELP)
    p.add_argument("--name", action="append", required=True, help="a search's name; repeat for several datasets")
    p.add_argument("--storage", help="where the searches' results lie; default ~/vitplast_tune_results")
    p.add_argument("--tracking-uri", help="MLflow tracking URI; default: the one the search used")
    p.add_argument("--criteria", action="store_true", help="also the criteria lab: pre-training predictors per subset")
    p.add_argument("--out", help="where the cross-dataset files go; default <storage>/cross-<names>")
    args = p.parse_args(argv)
    from vitplast_tune.search import driver, results

    if args.storage:
        outputs.existing_dir(args.storage, "--storage")
    if args.out:
        outputs.output_dir(args.out, "--out")
    if len(args.name) == 1:
        print(results.summary(driver.reanalyze(args.name[0], args.storage, args.tracking_uri, criteria=args.criteria)))
    else:
        print(driver.compare_datasets(args.name, args.storage, args.out))
    return 0


def analyze(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast-analyze``."""
    run_main(lambda: analyze_main(argv))


# ----------------------------------------------------------------------------- vitplast-plasticity


def positive_int(text: str) -> int:
    """An argparse type: a positive integer."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def plasticity_parser() -> argparse.ArgumentParser:
    """The arguments of ``vitplast-plasticity``."""

    p = Parser(description=PLASTICITY_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model",
        default=TESTBED_MODEL,
        help=f"timm model name with an optional pretrained tag (default: {TESTBED_MODEL})",
    )
    p.add_argument(
        "--weights",
        default=None,
        help="local weights file (safetensors or torch state dict) to load instead of the tag's",
    )
    p.add_argument(
        "--no-pretrained", action="store_true", help="random initialisation: load no weights (for checks only)"
    )
    p.add_argument(
        "--dataset",
        default="digits",
        help="downstream dataset; its test split is paired with the reference (default: digits)",
    )
    p.add_argument(
        "--reference",
        default="fractals",
        help="reference (pretraining-like) dataset (default: fractals; the paper uses ImageNet val)",
    )
    p.add_argument(
        "--reference-split",
        choices=("test", "train"),
        default="test",
        help="split of the reference dataset to use (default: test)",
    )
    p.add_argument("--data-dir", default=None, help="where datasets live (default: ~/.cache/vitplast_tune/data)")
    p.add_argument("--download", action="store_true", help="download missing torchvision datasets")
    p.add_argument(
        "--variant",
        choices=PLASTICITY_VARIANTS,
        default="paper",
        help="paper: every component applied to the embedding output (the paper's definition, default); "
        "in_network: every component on its real input in the forward pass",
    )
    p.add_argument("--batch-size", type=positive_int, default=64, help="pairs per batch (default: 64)")
    p.add_argument(
        "--max-pairs",
        type=positive_int,
        default=None,
        help="stop after this many pairs (default: all; the paper uses 12,800)",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="output directory (default: ~/.cache/vitplast_tune/plasticity/<model>__<dataset>__vs__<reference>__<variant>)",
    )
    return p


def plasticity_main(argv: Sequence[str] | None = None) -> int:
    """Measure plasticity from command-line arguments; print the ranking and the files written."""
    args = plasticity_parser().parse_args(argv)
    from vitplast_tune.predictors.report import plasticity_report
    from vitplast_tune.vit.plasticity import resolve_device

    resolve_device(args.device)  # before any work: a device torch does not know, or a GPU that is not there
    if args.out is not None:
        outputs.output_dir(args.out, "--out")

    report = plasticity_report(
        args.model,
        weights=args.weights,
        pretrained=not args.no_pretrained,
        dataset=args.dataset,
        reference=args.reference,
        reference_split=args.reference_split,
        data_dir=args.data_dir,
        download=args.download,
        variant=args.variant,
        batch_size=args.batch_size,
        max_pairs=args.max_pairs,
        out_dir=args.out,
        device=args.device,
    )
    meta = report.meta
    print(
        f"plasticity ({meta['variant']} variant) of {meta['model']}: {meta['dataset']} test vs "
        f"{meta['reference']} {meta['reference_split']}, {meta['n_pairs']} pairs, {meta['seconds']:.1f} s"
    )
    print(report.ranking.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for kind, path in report.files.items():
        print(f"{kind:>4}: {path}")
    return 0


def plasticity(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast-plasticity``."""
    run_main(lambda: plasticity_main(argv))


# ----------------------------------------------------------------------------- vitplast-pretrain


def pretrain_main(argv: Sequence[str] | None = None) -> int:
    """Pretrain the testbed ViT from command-line arguments (every field of ``PretrainConfig`` is a flag)."""
    p = Parser(description=PRETRAIN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--out",
        default=str(TESTBED_WEIGHTS),
        help="safetensors file to write; the provenance JSON goes beside it (default: the shipped file)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="write over an existing --out file (such as the shipped weights)"
    )
    add_dataclass_flags(p, PretrainConfig())
    args = p.parse_args(argv)
    config = PretrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PretrainConfig)}).validate()
    out = outputs.output_file(args.out, "--out", suffix=".safetensors", overwrite=args.overwrite)
    outputs.output_file(out.with_suffix(".json"), "--out's provenance file", overwrite=True)
    from vitplast_tune.vit.pretraining import pretrain_testbed

    command = shlex.join(["vitplast-pretrain", *(sys.argv[1:] if argv is None else argv)])
    pretrain_testbed(out, config, command=command)
    return 0


def add_dataclass_flags(parser: argparse.ArgumentParser, defaults: Any) -> None:
    """One ``--flag`` per field of a dataclass instance, typed and defaulted from it, its help from the field's
    ``help`` metadata."""
    for f in dataclasses.fields(defaults):
        value = getattr(defaults, f.name)
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=type(value),
            default=value,
            help=f"{f.metadata.get('help', f.name)} (default: {value:g})",
        )


def pretrain(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast-pretrain``."""
    run_main(lambda: pretrain_main(argv))


# ----------------------------------------------------------------------------- vitplast-recommend

RECOMMEND_HELP = """Which component subsets to finetune, in minutes and with no search: measure plasticity and the
gradient criteria of --model on --dataset, rank every subset by the criterion with the best evidence on the searches recorded so far,
and print the ranking with that evidence. --verify K then runs a short grid over the top K subsets, full finetuning
and the linear probe, and says whether the recommendation held.

    vitplast-recommend --model vit_testbed_patch8_32.fractal --dataset digits --verify 3"""


def recommend_main(argv: Sequence[str] | None = None) -> int:
    """Rank the subsets of --model on --dataset with their evidence; --verify K: check the top K by a short driver."""
    from pathlib import Path

    from vitplast_tune.config import FinetuneConfig

    train = FinetuneConfig()
    p = Parser(description=RECOMMEND_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=train.model, help=f"timm model name (default: {train.model})")
    p.add_argument("--weights", help="local weights for --model (safetensors or torch state dict)")
    p.add_argument("--dataset", default=train.dataset, help=f"dataset (default: {train.dataset})")
    p.add_argument("--data-dir", help="where the dataset lies (default ~/.cache/vitplast_tune/data)")
    p.add_argument("--budget-params", type=positive_int, help="only subsets training at most this many parameters")
    p.add_argument("--top", type=positive_int, default=10, help="subsets printed (default: 10)")
    p.add_argument("--storage", help="where searches are recorded, read for evidence (default ~/vitplast_tune_results)")
    p.add_argument("--plasticity-pairs", type=positive_int, help="most image pairs for plasticity; default: all")
    p.add_argument("--verify", type=int, default=0, metavar="K", help="a short grid: the top K subsets, all and head")
    p.add_argument(
        "--verify-steps", type=positive_int, help=f"steps per verification trial (default: {train.max_steps})"
    )
    args = p.parse_args(argv)
    from vitplast_tune.recommend import ranking, verify
    from vitplast_tune.search import driver
    from vitplast_tune.vit import models

    if args.verify < 0:
        raise UserError("--verify must not be negative")
    if args.storage:
        outputs.existing_dir(args.storage, "--storage")
    chosen = dict(model=args.model, weights=args.weights, dataset=args.dataset, data_dir=args.data_dir)
    settings = FinetuneConfig(**chosen)
    models.check_weights(settings.model, settings.weights, settings.pretrained)
    root = Path(args.storage).expanduser() if args.storage else storage.default_storage()
    rec = ranking.recommend(settings, root, budget=args.budget_params, plasticity_pairs=args.plasticity_pairs)
    print(ranking.describe(rec, args.top), flush=True)
    if args.verify:
        lrs = list(verify.VERIFY_LRS)
        print(f"\nVerifying: grid of the top {args.verify} subsets, all and head x lr {lrs} ...", flush=True)
        from vitplast_tune.search import results

        table, found = driver.verify_recommendation(rec, args.verify, root, max_steps=args.verify_steps)
        print(verify.describe_verification(table))
        print(f"\n{results.describe_pareto(found.trials)}")
        print(f"search: {found.plan.local_dir} (MLflow parent run {found.plan.name})")
    return 0


def recommend(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast-recommend``."""
    run_main(lambda: recommend_main(argv))


# ----------------------------------------------------------------------------- vitplast-ui

UI_HELP = """Open a search's runs in the MLflow UI: start the UI on the search's tracking store (bound to 127.0.0.1) and
print the link to its view (and to its best trial's run); Ctrl-C stops it. A search that recorded to an MLflow server
only gets its links printed.

    vitplast-ui quickstart --open"""


def ui_main(argv: Sequence[str] | None = None) -> int:
    """Serve a search's MLflow store and print (with --open, open) the link to its view."""
    p = argparse.ArgumentParser(description=UI_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="the search's name (its --name)")
    p.add_argument("--storage", help="where the search's results lie; default ~/vitplast_tune_results")
    p.add_argument("--port", type=positive_int, default=5000, help="the UI's port on 127.0.0.1 (default: 5000)")
    p.add_argument("--open", action="store_true", help="open the view in the default web browser")
    args = p.parse_args(argv)
    from vitplast_tune.search import ui

    return ui.serve(args.name, args.storage, args.port, args.open)


def ui(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast-ui``."""
    run_main(lambda: ui_main(argv))


# ----------------------------------------------------------------------------- python -m vitplast_tune


def lab(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast-lab`` (``labs.main``: the criteria lab on offline tasks, pooled across them)."""
    from vitplast_tune import labs

    run_main(lambda: labs.main(argv, Parser))


COMMANDS: dict[str, Callable[[Sequence[str] | None], NoReturn]] = {
    "search": search,
    "analyze": analyze,
    "plasticity": plasticity,
    "pretrain": pretrain,
    "recommend": recommend,
    "ui": ui,
    "lab": lab,
}


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """``python -m vitplast_tune COMMAND [flags]``: the installed command ``vitplast-COMMAND`` with its flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        usage = f"usage: python -m vitplast_tune {{{','.join(COMMANDS)}}} [flags]   (each also vitplast-COMMAND)"
        asked = bool(argv) and argv[0] in ("-h", "--help")
        print(usage if asked or not argv else f"{usage}\nerror: unknown command {argv[0]!r}", file=sys.stderr)
        sys.exit(0 if asked else 2)
    sys.argv[0] = f"vitplast-{argv[0]}"  # what argparse prints as the program's name
    COMMANDS[argv[0]](argv[1:])
