#!/usr/bin/env python
"""Run a Ray Tune search over which ViT components to finetune: python scripts/search.py --space component_subsets"""

from __future__ import annotations

import argparse
import json

from vitplast_tune.cli import run_main
from vitplast_tune.errors import UserError
from vitplast_tune.plan import SearchOptions
from vitplast_tune.training import FinetuneConfig

RUN = SearchOptions()  # how a search runs: the one source of these defaults
TRAIN = FinetuneConfig()  # what a trial does, unless the space file's defaults say otherwise


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    space_default = "the space file's, else {}"
    p.add_argument("--space", default=RUN.space, help=f"space file: a name in search_spaces/ or a path to a .yaml file (default: {RUN.space})")
    p.add_argument("--name", help="search name (the MLflow parent run and the results folder); default: <space>-<date>")
    p.add_argument("--resume", action="store_true", help="continue the interrupted search --name")
    p.add_argument("--num-samples", type=int, help="number of trials (a grid: repeats of the grid); default: the space file's")
    p.add_argument("--max-steps", type=int, help=f"training steps per trial; default: {space_default.format(TRAIN.max_steps)}")
    p.add_argument("--batch-size", type=int, help=f"training batch size; default: {space_default.format(TRAIN.batch_size)}")
    p.add_argument("--eval-every", type=int, help=f"evaluate and report every N steps; default: {space_default.format(TRAIN.eval_every)}")
    p.add_argument("--model", help=f"timm model name, e.g. vit_base_patch16_224.augreg_in21k; default: {space_default.format(TRAIN.model)}")
    p.add_argument("--weights", help="local weights for --model (safetensors or torch state dict), instead of the hub")
    p.add_argument("--dataset", help="digits (offline default), cifar10, cifar100, pets, flowers102, cifar10c:<corruption>, imagefolder")
    p.add_argument("--data-dir", help="where the dataset lies (default ~/.cache/vitplast_tune/data)")
    p.add_argument("--download", action="store_true", default=None, help="download the dataset when missing (needs a network)")
    p.add_argument("--storage", help="Ray Tune results: a local directory or a URI (s3://, gs://); default ~/vitplast_tune_results")
    p.add_argument("--tracking-uri", help="MLflow tracking URI; default sqlite:///<storage>/mlflow.db")
    p.add_argument("--address", help="join this Ray cluster (e.g. ray://host:10001 or auto); default: RAY_ADDRESS, else a local Ray instance")
    p.add_argument("--cpus-per-trial", type=float, default=RUN.cpus_per_trial, help=f"CPUs reserved per trial, also its torch threads (default: {RUN.cpus_per_trial:g})")
    p.add_argument("--gpus-per-trial", type=float, default=RUN.gpus_per_trial, help=f"GPUs per trial; fractions such as 0.5 share a GPU (default: {RUN.gpus_per_trial:g})")
    p.add_argument("--resources-per-trial", type=json.loads, default={}, help='custom Ray resources per trial, as JSON, e.g. \'{"a100": 1}\'')
    p.add_argument("--max-concurrent", type=int, help="most trials running at once; default: as many as resources allow")
    p.add_argument("--max-failures", type=int, default=RUN.max_failures, help=f"retries of a trial that crashes, from its last checkpoint (default: {RUN.max_failures})")
    p.add_argument("--seed", type=int, default=RUN.seed, help=f"seed of the search algorithm, and the training seed unless the space sets one (default: {RUN.seed})")
    p.add_argument("--no-plasticity", action="store_true", help="skip measuring plasticity and its correlation with accuracy")
    p.add_argument("--plasticity-variant", default=RUN.plasticity_variant, choices=("paper", "in_network"),
                   help="paper: every component applied to the embedding output (the paper's definition, default); in_network: real inputs")
    p.add_argument("--plasticity-reference", default=RUN.plasticity_reference,
                   help=f"reference dataset paired with the downstream test split (default: {RUN.plasticity_reference}; the paper uses ImageNet val)")
    p.add_argument("--plasticity-pairs", type=int, help="most image pairs for plasticity (the paper uses 12,800); default: all")
    p.add_argument("--quiet", action="store_true", help="no progress lines while trials run")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    from vitplast_tune import results, search

    settings = dict(model=args.model, weights=args.weights, dataset=args.dataset, data_dir=args.data_dir,
                    download=args.download, max_steps=args.max_steps, batch_size=args.batch_size, eval_every=args.eval_every)  # fmt: skip
    if not isinstance(args.resources_per_trial, dict):
        raise UserError("--resources-per-trial must be a JSON object such as '{\"a100\": 1}'")
    options = SearchOptions(
        space=args.space, name=args.name, storage=args.storage, tracking_uri=args.tracking_uri, address=args.address,
        num_samples=args.num_samples, cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial,
        resources_per_trial=args.resources_per_trial, max_concurrent=args.max_concurrent, seed=args.seed,
        resume=args.resume, max_failures=args.max_failures, settings=settings, verbose=0 if args.quiet else 1,
        plasticity=not args.no_plasticity, plasticity_variant=args.plasticity_variant,
        plasticity_reference=args.plasticity_reference, plasticity_pairs=args.plasticity_pairs,
    )  # fmt: skip
    print(results.summary(search.run(options)))
    return 0


if __name__ == "__main__":
    run_main(main)
