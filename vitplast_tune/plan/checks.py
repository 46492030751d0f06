"""Check the flags of a search that need no model and no data; each problem is a ``UserError``."""

from __future__ import annotations

from pathlib import Path

from vitplast_tune import environment, output_paths
from vitplast_tune.config import cache_dir, check_variant
from vitplast_tune.errors import OptionsError, UserError
from vitplast_tune.log import LEVEL_ENV, LEVELS, environment_level
from vitplast_tune.plan import resources, services
from vitplast_tune.plan.options import SearchOptions
from vitplast_tune.plan.resources import CLUSTER_CONFIG_ENV
from vitplast_tune.plan.search_plan import Running


def check_resources(options: SearchOptions) -> None:
    """Refuse per-trial resources, concurrency, retries, timeout or budget that are not usable numbers."""
    if options.cpus_per_trial < 0 or options.gpus_per_trial < 0:
        raise UserError("--cpus-per-trial and --gpus-per-trial must not be negative")
    if options.cpus_per_trial == 0 and options.gpus_per_trial == 0 and not options.resources_per_trial:
        raise UserError("a trial needs some resource: give --cpus-per-trial or --gpus-per-trial above 0")
    _check_workers(options)
    if any(v < 0 for v in options.resources_per_trial.values()):
        raise UserError("custom resources per trial must not be negative")
    if options.max_concurrent is not None and options.max_concurrent < 1:
        raise UserError("--max-concurrent must be at least 1")
    if options.max_failures is not None and options.max_failures < 0:
        raise UserError("--max-failures must not be negative")
    if not options.connect_timeout_s > 0:
        raise UserError(f"--connect-timeout must be positive, got {options.connect_timeout_s:g}")
    if options.max_trainable_params is not None and options.max_trainable_params < 1:
        raise UserError("the parameter budget (max_trainable_params) must be a positive number of parameters")


def _check_workers(options: SearchOptions) -> None:
    """Refuse workers that cannot each train on one GPU, a share of one when alone, or CPUs."""
    gpus, workers = options.gpus_per_trial, options.workers_per_trial or max(1, int(options.gpus_per_trial))
    if options.placement not in ("pack", "spread"):
        raise UserError(f"--placement must be pack or spread, got {options.placement!r}")
    if options.workers_per_trial < 0:
        raise UserError(f"--workers-per-trial must not be negative, got {options.workers_per_trial} (0: one per GPU)")
    if gpus > 1 and gpus != workers:
        raise UserError(
            f"--gpus-per-trial {gpus:g} with {workers} worker(s): each data-parallel worker trains on one GPU; give a "
            "whole number of GPUs and as many --workers-per-trial (the default), or 1 GPU or less to one worker"
        )
    if workers > 1 and 0 < gpus < workers:
        raise UserError(f"--workers-per-trial {workers} needs a whole GPU each: --gpus-per-trial {workers}, or 0")


def _check_writable(path: Path, origin: str = "--storage") -> None:
    """Refuse a storage folder this process cannot write or make; it is not made here."""
    output_paths.output_dir(path, origin)  # a file, or a path under one
    services.check_writable(path, f"storage path {path} (from {origin})", "; pass --storage DIR")


def _check_environment(running: Running) -> None:
    """Refuse a bad cache folder, log level or cluster launcher YAML, naming its variable.

    The storage's and MLflow's variables are checked with their services (``services``).
    """
    cache_dir()  # VITPLAST_CACHE_DIR: a folder, or a path where one can be made
    level = (environment.read(LEVEL_ENV) or "").strip()
    if level and environment_level() is None:
        raise OptionsError(f"{LEVEL_ENV}={level} names no level; use one of {', '.join(LEVELS)}, or unset it")
    config = environment.read(CLUSTER_CONFIG_ENV) if running.joining else None
    if config and not Path(config).expanduser().is_file():
        raise OptionsError(
            f"{CLUSTER_CONFIG_ENV}={config} is not a file; point it at the cluster launcher YAML, or unset it"
        )


def _check_plasticity(running: Running) -> None:
    """Refuse an unknown plasticity variant, or a pair count below 1."""
    if running.plasticity:
        check_variant(running.plasticity_variant)
    if running.plasticity_pairs is not None and running.plasticity_pairs < 1:
        raise UserError(f"--plasticity-pairs must be at least 1, got {running.plasticity_pairs}")


def _check_reference(reference: str | None, dataset: str) -> None:
    """Refuse a plasticity reference that is the trials' own dataset."""
    if reference == dataset:
        raise UserError(
            f'--plasticity-reference is "{dataset}", the dataset itself: plasticity compares the dataset with '
            f"another distribution; give another reference (--plasticity-reference NAME) or --no-plasticity"
        )


def _check_local_resources(running: Running) -> None:
    """Refuse a trial that asks for more than this machine has, when the search starts its own Ray."""
    if running.joining is None and not resources.ray_running_here():
        resources._check_local_fits(running.resources.request)
