"""``vitplast recommend``: rank the component subsets of a model on a dataset with their evidence, in minutes and with
no search; ``--verify K`` checks the top K with a short grid."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from vitplast_tune import output_paths, storage
from vitplast_tune.cli.base import Parser, positive_int, print_json, run_main
from vitplast_tune.errors import UserError

HELP = (
    "Rank which component subsets to finetune, by trainable parameters unless a pooled criteria-lab verdict backs "
    "a criterion; no search."
)
RECOMMEND_HELP = """Which component subsets to finetune, in minutes and with no search: measure plasticity and the
gradient criteria of --model on --dataset, rank every subset by its number of trainable parameters (the baseline
every criterion must beat), or by a criterion that a pooled criteria-lab verdict recorded under --storage found
better (vitplast lab pooled), and print the ranking with the evidence recorded so far. --verify K then runs a
short grid over the top K subsets, full finetuning and the linear probe, and says whether the recommendation held.

    vitplast recommend --model vit_testbed_patch8_32.fractal --dataset digits --verify 3"""


def parser() -> Parser:
    """The arguments of ``vitplast recommend``; defaults read from ``FinetuneConfig``."""
    from vitplast_tune.config import FinetuneConfig

    train = FinetuneConfig()
    p = Parser(
        prog="vitplast recommend", description=RECOMMEND_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    p.add_argument("--json", action="store_true", help="one JSON object instead of the text, for scripts")
    return p


def recommend_main(argv: Sequence[str] | None = None) -> int:
    """Rank the subsets of --model on --dataset with their evidence; --verify K: check the top K by a short driver."""
    from pathlib import Path

    from vitplast_tune.config import FinetuneConfig

    args = parser().parse_args(argv)
    from vitplast_tune import workflows
    from vitplast_tune.data import datasets
    from vitplast_tune.recommend import ranking, verify
    from vitplast_tune.vit import models

    if args.verify < 0:
        raise UserError("--verify must not be negative")
    if args.storage:
        output_paths.existing_dir(args.storage, "--storage")
    chosen = dict(model=args.model, weights=args.weights, dataset=args.dataset, data_dir=args.data_dir)
    settings = FinetuneConfig(**chosen)
    models.check_weights(settings.model, settings.weights, settings.pretrained)
    datasets.check_applies(settings.dataset, settings.data_dir, False)
    root = Path(args.storage).expanduser() if args.storage else storage.default_storage()
    rec = ranking.recommend(settings, root, budget=args.budget_params, plasticity_pairs=args.plasticity_pairs)
    said = ranking.as_plain(rec, args.top)
    if not args.json:
        print(ranking.describe(rec, args.top), flush=True)
    if args.verify:
        lrs = list(verify.VERIFY_LRS)
        doing = f"Verifying: grid of the top {args.verify} subsets, all and head x lr {lrs} ..."
        print(doing, file=sys.stderr, flush=True) if args.json else print(f"\n{doing}", flush=True)
        from vitplast_tune.records.pareto import describe_pareto

        table, found = workflows.verify_recommendation(rec, args.verify, root, max_steps=args.verify_steps)
        said["verification"] = {"table": table, "search": str(found.place.local_dir), "parent_run": found.place.name}
        if not args.json:
            print(verify.describe_verification(table))
            print(f"\n{describe_pareto(found.trials)}")
            print(f"search: {found.place.local_dir} (MLflow parent run {found.place.name})")
    if args.json:
        print_json(said)
    return 0


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``vitplast recommend`` (and its alias ``vitplast-recommend``)."""
    run_main(lambda: recommend_main(argv))
