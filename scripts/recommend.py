#!/usr/bin/env python
"""Which component subsets to finetune, in minutes and with no search: measure plasticity and the gradient criteria
of --model on --dataset, rank every subset by the criterion with the best evidence on the searches recorded so far,
and print the ranking with that evidence. --verify K then runs a short grid over the top K subsets, full finetuning
and the linear probe, and says whether the recommendation held.

    python scripts/recommend.py --model vit_testbed_patch8_32.fractal --dataset digits --verify 3
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitplast_tune.cli import run_main
from vitplast_tune.training import FinetuneConfig

TRAIN = FinetuneConfig()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=TRAIN.model, help=f"timm model name (default: {TRAIN.model})")
    p.add_argument("--weights", help="local weights for --model (safetensors or torch state dict)")
    p.add_argument("--dataset", default=TRAIN.dataset, help=f"dataset (default: {TRAIN.dataset})")
    p.add_argument("--data-dir", help="where the dataset lies (default ~/.cache/vitplast_tune/data)")
    p.add_argument("--budget-params", type=int, help="only subsets that train at most this many parameters (head included)")
    p.add_argument("--top", type=int, default=10, help="subsets printed (default: 10)")
    p.add_argument("--storage", help="where searches are recorded, read for evidence (default ~/vitplast_tune_results)")
    p.add_argument("--plasticity-pairs", type=int, help="most image pairs for plasticity; default: all")
    p.add_argument("--verify", type=int, default=0, metavar="K", help="run a short grid over the top K subsets + all + head")
    p.add_argument("--verify-steps", type=int, help=f"training steps per verification trial (default: {TRAIN.max_steps})")
    args = p.parse_args()
    from vitplast_tune import models, plan, recommend, verify
    from vitplast_tune.errors import UserError

    if args.budget_params is not None and args.budget_params < 1 or args.verify < 0:
        raise UserError("--budget-params and --verify must be positive")
    settings = FinetuneConfig(model=args.model, weights=args.weights, dataset=args.dataset, data_dir=args.data_dir).to_dict()
    models.check_weights(settings["model"], settings["weights"], settings["pretrained"])
    storage = Path(args.storage).expanduser() if args.storage else plan.default_storage()
    rec = recommend.recommend(settings, storage, budget=args.budget_params, plasticity_pairs=args.plasticity_pairs)
    print(recommend.describe(rec, args.top), flush=True)
    if args.verify:
        print(f"\nVerifying: grid of the top {args.verify} subsets, all and head x lr {list(verify.VERIFY_LRS)} ...", flush=True)
        from vitplast_tune import results

        table, search = verify.verify(rec, args.verify, storage, max_steps=args.verify_steps)
        print(verify.describe_verification(table))
        print(f"\n{results.describe_pareto(search.trials)}\nsearch: {search.plan.local_dir} (MLflow parent run {search.plan.name})")
    return 0


if __name__ == "__main__":
    run_main(main)
