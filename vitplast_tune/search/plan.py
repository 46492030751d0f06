"""The plan of a search: the space file, the flags and the files they name, validated into one typed
object before anything starts (no Ray, no MLflow run, no model download).

Defaults have one source each: ``SearchOptions`` for how the search runs (the command line's help
reads them), ``training.FinetuneConfig`` for what a trial does (a space file's ``defaults`` and the
flags override it). Every problem is a ``UserError``: one line, exit code 2.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplast_tune import outputs
from vitplast_tune.config import FinetuneConfig, check_variant
from vitplast_tune.errors import UserError, did_you_mean
from vitplast_tune.search import spaces
from vitplast_tune.search.mlflow_view import VIEW_TAG_PREFIX, share_key
from vitplast_tune.search.trial import METRICS, trial_config
from vitplast_tune.storage import SEARCH_FILE, default_storage, is_uri, join, read_record, storage_uri

if TYPE_CHECKING:
    from vitplast_tune.data.decoded import InMemory

EXPERIMENT = "vitplast_tune"  # the MLflow experiment a search logs to unless --experiment or MLFLOW_EXPERIMENT_NAME
# MLflow's own environment variables, honoured as defaults (flags win).
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_SEED = 0
DEFAULT_MAX_FAILURES = 2
# Settings a resumed search may change: where the data comes from, not what the trials do.
RESUMABLE_SETTINGS = ("download",)
# A search's name is a folder (at most 255 bytes on common filesystems) and part of MLflow keys of at most 250
# characters: the saved view's experiment tag (VIEW_TAG_PREFIX + share_key(name)) is the longest.
MAX_NAME = 250 - len(VIEW_TAG_PREFIX + share_key(""))
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,+=@-]*")
DEFAULT_CONNECT_TIMEOUT_S = 30.0
# What trials of a search recorded before ``augment`` existed trained with: the paper's crop + flip on every dataset.
RECORDED_AUGMENTATION = "paper"


@dataclass
class SearchOptions:
    """How a search runs (what the command line controls); ``settings`` (FinetuneConfig fields) override the space
    file's defaults: a key given is a value, None included (a key left out keeps the space file's).

    ``seed`` and ``max_failures`` left None mean ``DEFAULT_SEED`` and ``DEFAULT_MAX_FAILURES`` for a new
    search, and the recorded values for ``resume``.
    """

    space: str = "component_subsets"
    name: str | None = None
    storage: str | None = None
    tracking_uri: str | None = None  # default: $MLFLOW_TRACKING_URI, else sqlite:///<storage>/mlflow.db
    experiment: str | None = None  # default: $MLFLOW_EXPERIMENT_NAME, else EXPERIMENT
    address: str | None = None
    num_samples: int | None = None
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    workers_per_trial: int = 0  # data-parallel workers of a trial (search/parallel.py); 0: one per GPU, at least one
    resources_per_trial: dict[str, float] = field(default_factory=dict)
    max_concurrent: int | None = None
    seed: int | None = None
    resume: bool = False
    max_failures: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    plasticity: bool = True
    plasticity_variant: str = "paper"
    plasticity_reference: str = "fractals"
    plasticity_pairs: int | None = None
    max_trainable_params: int | None = None  # the parameter budget; overrides the space file's
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S  # --address: how long to wait for the head to answer
    budgets: tuple[int, ...] | None = None  # step budgets of a grid; override the space file's (``--budgets``)
    verbose: int = 1

    @property
    def trial_resources(self) -> dict[str, float]:
        """The Ray resources one trial asks for."""
        return {"cpu": self.cpus_per_trial, "gpu": self.gpus_per_trial, **self.resources_per_trial}


@dataclass
class SearchPlan:
    """A validated search: everything decided, nothing started."""

    spec: spaces.SearchSpec
    options: SearchOptions
    name: str
    storage: str
    tracking_uri: str
    settings: FinetuneConfig  # what every trial does, before its sampled parameters
    decoded: InMemory | None = None  # a small dataset, decoded once for every trial
    search_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # tags the MLflow parent run
    seed: int = DEFAULT_SEED
    max_failures: int = DEFAULT_MAX_FAILURES
    max_concurrent: int | None = None
    notes: list[str] = field(default_factory=list)  # adjustments the user is told once (e.g. a clamped grace period)
    experiment: str = EXPERIMENT  # the MLflow experiment of its runs

    @property
    def location(self) -> str:
        """Where Ray Tune keeps the search: its storage joined with its name (a path, or a URI)."""
        return join(self.storage, self.name)

    @property
    def local_dir(self) -> Path | None:
        """The search's directory when storage is a local path (None for s3:// and the like)."""
        return None if is_uri(self.storage) else Path(self.storage) / self.name

    @property
    def max_trainable_params(self) -> int | None:
        """The parameter budget: the option's, else the space file's; trials over it are not trained."""
        return self.options.max_trainable_params or self.spec.max_trainable_params

    @property
    def results_dir(self) -> Path:
        """Where the search's own files (trial table, analysis) go: its directory, else a local one."""
        return self.local_dir or default_storage() / self.name


def prepare(options: SearchOptions) -> SearchPlan:
    """Validate the space, flags, files and resume state into a plan; raise UserError on the first problem.

    Nothing is started or written (apart from creating the storage directory): no Ray, no MLflow run.
    """
    spec = spaces.load_space(options.space).with_overrides(num_samples=options.num_samples, budgets=options.budgets)
    if spec.budgets and options.settings.get("max_steps") is not None:
        raise UserError(f"{spec.path.name} trains at step budgets {spec.budget_steps}: give --budgets, not --max-steps")
    _check_metric(spec)
    _check_resources(options)
    storage = storage_uri(str(options.storage or default_storage()))
    if not is_uri(storage):
        storage = str(Path(storage).expanduser().resolve())
        _check_writable(Path(storage))
    name = check_name(options.name or default_name(spec), storage)
    record = _resume_record(spec, options, storage, name)
    if record is None:
        settings = _settings(spec, options)
        tracking_uri, experiment, said = mlflow_target(options, storage)
        plan = SearchPlan(
            spec,
            options,
            name,
            storage,
            tracking_uri,
            settings,
            seed=_given(options.seed, DEFAULT_SEED),
            max_failures=_given(options.max_failures, DEFAULT_MAX_FAILURES),
            max_concurrent=options.max_concurrent,
            experiment=experiment,
        )
    else:
        plan, said = _resumed_plan(spec, options, storage, name, record), []
    plan.spec, plan.notes = fit_scheduler(plan.spec, plan.settings.max_steps)
    plan.notes += said
    _check_plasticity(options, plan.settings.dataset)
    _check_local_resources(options)
    reference = options.plasticity_reference if options.plasticity else None
    budget = Budget(plan.max_trainable_params, subsets(plan.spec, plan.settings))
    plan.decoded, plan.settings.augment = _check_inputs(
        plan.settings, reference, budget, searched_augmentations(plan.spec)
    )
    return plan


def searched_augmentations(spec: spaces.SearchSpec) -> list[str]:
    """The augmentation recipes a space's ``augment`` parameter may take (none when it does not vary)."""
    augment = spec.parameters.get("augment")
    return [] if augment is None else [v for v in augment.corners() if v is not None]


def default_name(spec: spaces.SearchSpec) -> str:
    """``<space>-<date>-<time>``, with characters a name does not take (``check_name``) replaced by "-"."""
    stem = re.sub(r"[^A-Za-z0-9_.,+=@-]", "-", spec.name).lstrip(".,+=@-")[:64] or "search"
    return f"{stem}-{datetime.now():%Y%m%d-%H%M%S}"


def check_name(name: str, storage: str) -> str:
    """``name`` when it can name the search's folder and its MLflow records; else UserError saying why."""
    if not NAME_PATTERN.fullmatch(name):
        raise UserError(
            f'--name "{name}" must be a plain name: letters, digits and . _ , + = @ - (not first: . , + = @ -)'
        )
    limit = MAX_NAME
    if not is_uri(storage):
        with contextlib.suppress(OSError, ValueError):  # a storage folder that cannot tell
            limit = min(limit, os.pathconf(storage, "PC_NAME_MAX"))
    if len(name) > limit:
        raise UserError(
            f"--name is {len(name)} characters long; at most {limit} fit (MLflow keys take 250 characters, "
            f"{len(VIEW_TAG_PREFIX + share_key(''))} of them for the search's saved view, and a folder name 255 bytes)"
        )
    return name


def subsets(spec: spaces.SearchSpec, settings: FinetuneConfig) -> tuple[str, ...]:
    """Every component subset the search's trials may train (the space's ``components``, else the settings')."""
    param = spec.parameters.get("components")
    return tuple(param.grid_values()) if param is not None else (settings.components,)


@dataclass(frozen=True)
class Budget:
    """A parameter budget (None: none) and the subsets a search may train, checked against each other before Ray."""

    max_trainable_params: int | None
    subsets: tuple[str, ...]


def mlflow_target(options: SearchOptions, storage: str) -> tuple[str, str, list[str]]:
    """Where a new search records: the tracking URI and experiment (the flags, else MLflow's environment variables,
    else ``sqlite:///<storage>/mlflow.db`` and ``EXPERIMENT``), and a note for each value taken from the environment."""
    env_uri, env_experiment = os.environ.get(TRACKING_URI_ENV, "").strip(), os.environ.get(EXPERIMENT_ENV, "").strip()
    tracking_uri = options.tracking_uri or env_uri or _default_tracking_uri(storage)
    experiment = options.experiment if options.experiment is not None else env_experiment or EXPERIMENT
    if not experiment.strip():
        raise UserError("--experiment must name an MLflow experiment (it is empty)")
    notes = [
        f"MLflow {what} {value} from ${env} (a flag overrides it)"
        for what, value, env, flag in (
            ("tracking URI", tracking_uri, TRACKING_URI_ENV, options.tracking_uri),
            ("experiment", experiment, EXPERIMENT_ENV, options.experiment),
        )
        if flag is None and os.environ.get(env, "").strip()
    ]
    return tracking_uri, experiment, notes


def fit_scheduler(spec: spaces.SearchSpec, max_steps: int) -> tuple[spaces.SearchSpec, list[str]]:
    """The space with its scheduler's grace period clamped to the trial budget, and the note saying so."""
    s = spec.scheduler
    if s.name == "fifo" or s.grace_period <= max_steps:
        return spec, []
    note = (
        f"scheduler grace_period {s.grace_period} is above max_steps {max_steps}: using {max_steps}, "
        "so no trial is stopped early"
    )
    return replace(spec, scheduler=replace(s, grace_period=max_steps)), [note]


def write_record(plan: SearchPlan, parent_run_id: str) -> None:
    """Write the search's record (space fingerprint, settings, MLflow parent run) that ``--resume`` checks."""
    directory = plan.local_dir
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "name": plan.name,
        "search_id": plan.search_id,
        "space_path": str(plan.spec.path),
        "fingerprint": plan.spec.fingerprint,
        "tracking_uri": plan.tracking_uri,
        "experiment": plan.experiment,
        "parent_run_id": parent_run_id,
        "settings": plan.settings.to_dict(),
        "num_samples": plan.spec.num_samples,
        "budgets": list(plan.spec.budget_steps) or None,
        "seed": plan.seed,
        "max_concurrent": plan.max_concurrent,
        "max_failures": plan.max_failures,
    }
    (directory / SEARCH_FILE).write_text(json.dumps(record, indent=2, default=str))


def _settings(spec: spaces.SearchSpec, options: SearchOptions) -> FinetuneConfig:
    """The trial settings: FinetuneConfig defaults < space defaults < command line; all validated."""
    overrides = dict(options.settings)  # None is a value here (--set weights=none): a key left out keeps the space's
    try:
        base = resolve_paths(FinetuneConfig.from_dict({**spec.defaults, **overrides}))
        base.seed = overrides.get("seed", spec.defaults.get("seed", _given(options.seed, DEFAULT_SEED)))
        if not base.threads:
            base.threads = max(1, int(options.cpus_per_trial))
        for config in spec.corner_configs():
            trial_config(config, base).validate()
    except UserError as exc:
        raise UserError(f"{exc} (settings from {spec.path.name} and the command line)") from None
    return base


def resolve_paths(settings: FinetuneConfig) -> FinetuneConfig:
    """``settings`` with ``weights`` and ``data_dir`` as absolute paths (``~`` expanded, relative to this working
    directory): trials run elsewhere, in working directories of Tune's (and files are sent to other nodes by path)."""
    absolute = lambda path: str(Path(path).expanduser().resolve()) if path is not None else None
    return replace(settings, weights=absolute(settings.weights), data_dir=absolute(settings.data_dir))


def _check_metric(spec: spaces.SearchSpec) -> None:
    """Each objective's metric must be one every trial reports, and its mode the direction that is better."""
    for metric, mode in spec.objectives or ((spec.metric, spec.mode),):
        if metric not in METRICS:
            raise UserError(
                f'{spec.path}: metric "{metric}" is not reported by trials{did_you_mean(metric, METRICS)}; '
                f"use one of {', '.join(METRICS)}"
            )
        if mode != METRICS[metric]:
            worst = f'{spec.path}: mode "{mode}" would search for the worst {metric}'
            raise UserError(f"{worst}; use mode: {METRICS[metric]}")


def _check_plasticity(options: SearchOptions, dataset: str) -> None:
    if options.plasticity:
        check_variant(options.plasticity_variant)
        if options.plasticity_reference == dataset:
            raise UserError(
                f'--plasticity-reference is "{dataset}", the dataset itself: plasticity compares the dataset with '
                f"another distribution; give another reference (--plasticity-reference NAME) or --no-plasticity"
            )
    if options.plasticity_pairs is not None and options.plasticity_pairs < 1:
        raise UserError(f"--plasticity-pairs must be at least 1, got {options.plasticity_pairs}")


def _check_local_resources(options: SearchOptions) -> None:
    """A search that starts its own Ray instance (no --address, Ray not started in this process): one trial's
    request must fit this machine, known before Ray starts (cluster.check_local_fits)."""
    from vitplast_tune.search import cluster

    if cluster.address(options.address) is None and not cluster.ray_running_here():
        cluster.check_local_fits(options.trial_resources)


def _check_inputs(
    settings: FinetuneConfig, reference: str | None, budget: Budget | None = None, augmentations: list[str] = ()
) -> tuple[InMemory | None, str]:
    """Check the model, its weights file, the dataset, the plasticity reference (None: none), that some subset fits
    the parameter budget and the augmentation recipes (the settings' and ``augmentations``, a space's searched ones);
    return a small dataset decoded once and the settings' recipe, the dataset's default when unset
    (``_inspect_inputs``).

    That takes torch, timm and torchvision, 0.4 GB that a process keeps once it has imported them, and after
    this only trials and measurements (Ray workers) need them. So when this process has not imported torch
    (the command line), the checks run in a short-lived Python process (``call_in_child``): the driver holds
    none of it while trials run.
    """
    if "torch" in sys.modules:
        return _inspect_inputs(settings, reference, budget, list(augmentations))
    return call_in_child("vitplast_tune.search.plan:_inspect_inputs", settings, reference, budget, list(augmentations))


def call_in_child(target: str, *args: Any) -> Any:
    """``module:function(*args)`` run in a short-lived Python process with this one's imports, its result returned
    here (arguments and result pickled through a temporary file): what needs torch runs there, and this process
    never holds it. A UserError there is raised here; any other failure prints its traceback and raises RuntimeError."""
    with tempfile.TemporaryDirectory(prefix="vitplast-child-") as tmp:
        exchange = Path(tmp) / "call.pkl"  # in: (target, args); out: (ok, result or UserError)
        exchange.write_bytes(pickle.dumps((target, args)))
        code = "import sys; from vitplast_tune.search.plan import _child_main; _child_main(sys.argv[1])"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's imports
        child = subprocess.run([sys.executable, "-c", code, str(exchange)], env=env)
        if child.returncode != 0:
            raise RuntimeError(f"{target} failed in a child process (exit {child.returncode})")
        ok, value = pickle.loads(exchange.read_bytes())
    if not ok:
        raise value
    return value


def _child_main(path: str) -> None:
    """The child of ``call_in_child``: the call pickled in ``path``, its result (or UserError) pickled back there."""
    exchange = Path(path)
    target, args = pickle.loads(exchange.read_bytes())
    module, _, name = target.partition(":")
    try:
        result = (True, getattr(importlib.import_module(module), name)(*args))
    except UserError as exc:
        result = (False, exc)
    exchange.write_bytes(pickle.dumps(result))


def _inspect_inputs(
    settings: FinetuneConfig, reference: str | None, budget: Budget | None, augmentations: list[str]
) -> tuple[InMemory | None, str]:
    """``_check_inputs`` in this process. The decoded dataset (None for datasets read lazily from disk) is
    shared with every trial through the object store, so it is decoded here and nowhere else on the driver.
    """
    from vitplast_tune.data import datasets
    from vitplast_tune.vit import models, recipe

    config = models.pretrained_data_config(settings.model)
    models.check_weights(settings.model, settings.weights, settings.pretrained)
    recipe.check(settings)  # what the recipe's settings need timm or the model's family for
    classes = datasets.num_classes(settings.dataset, settings.data_dir, settings.download)
    augment = datasets.resolve_augmentation(settings.dataset, settings.augment)
    for name in augmentations:
        datasets.resolve_augmentation(settings.dataset, name)
    image_cache = settings.image_cache
    if 0 < image_cache < max(config["input_size"][1:]):
        raise UserError(
            f"image_cache {image_cache} is below the model's input size {config['input_size'][-1]} px, so every image "
            f"would be enlarged again; use at least {round(config['input_size'][-1] / config.get('crop_pct', 1.0))} "
            "(the model's resize size), or 0 to decode the JPEGs each time"
        )
    if reference is not None:
        datasets.check_dataset_name(reference)
    if budget is not None and budget.max_trainable_params is not None:
        _check_budget(settings, classes, budget)
    decoded = datasets.decode_dataset(
        settings.dataset, config, data_dir=settings.data_dir, download=settings.download, image_cache=image_cache
    )
    return decoded, augment


def _check_budget(settings: FinetuneConfig, classes: int, budget: Budget) -> None:
    """UserError when every subset the search may train is over the parameter budget (counted on an untrained model
    with the dataset's head and the settings' blocks): the search could train nothing."""
    from vitplast_tune import components
    from vitplast_tune.vit import models
    from vitplast_tune.vit.families.registry import layout_of

    model = models.create_model(settings.model, classes, pretrained=False)
    layout = layout_of(model)
    counts = {s: sum(components.freeze(model, s, settings.blocks, layout=layout).values()) for s in budget.subsets}
    smallest = min(counts, key=counts.get)
    if counts[smallest] > budget.max_trainable_params:
        head = sum(components.freeze(model, "head", layout=layout).values())
        raise UserError(
            f"no trial fits the parameter budget max_trainable_params {budget.max_trainable_params:,}: the smallest "
            f"subset the search may train, {smallest}, trains {counts[smallest]:,} parameters (the head alone "
            f"{head:,}); raise the budget, or let components include smaller subsets"
        )


def _check_resources(options: SearchOptions) -> None:
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
    """Each data-parallel worker of a trial trains on one GPU (or a share of one when there is one worker), or CPUs."""
    gpus, workers = options.gpus_per_trial, options.workers_per_trial or max(1, int(options.gpus_per_trial))
    if options.workers_per_trial < 0:
        raise UserError(f"--workers-per-trial must not be negative, got {options.workers_per_trial} (0: one per GPU)")
    if gpus > 1 and gpus != workers:
        raise UserError(
            f"--gpus-per-trial {gpus:g} with {workers} worker(s): each data-parallel worker trains on one GPU; give a "
            "whole number of GPUs and as many --workers-per-trial (the default), or 1 GPU or less to one worker"
        )
    if workers > 1 and 0 < gpus < workers:
        raise UserError(f"--workers-per-trial {workers} needs a whole GPU each: --gpus-per-trial {workers}, or 0")


def _check_writable(path: Path) -> None:
    outputs.output_dir(path, "--storage")  # a file, or a path under one
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"storage path {path} is not writable ({exc.strerror}); pass --storage DIR") from None


def _resume_record(spec: spaces.SearchSpec, options: SearchOptions, storage: str, name: str) -> dict[str, Any] | None:
    """The record of the search to resume (None for a new search); UserError when resuming is impossible."""
    directory = None if is_uri(storage) else Path(storage) / name
    if directory is None:
        return None
    if not options.resume:
        if (directory / SEARCH_FILE).exists():
            raise UserError(
                f'search "{name}" already exists in {storage}; pass --resume to continue it, or another --name'
            )
        return None
    record = read_record(directory)
    if record["fingerprint"] != spec.fingerprint:
        raise UserError(
            f'search "{name}" was started with a different space file ({record["space_path"]}); '
            "resume it with that file, or start a new search with another --name"
        )
    return record


def _resumed_plan(spec: spaces.SearchSpec, options: SearchOptions, storage: str, name: str, record: dict) -> SearchPlan:
    """The plan of a resumed search: its recorded settings; a flag that would change them is refused.

    ``--max-failures`` applies to the remaining trials; ``--num-samples``, ``--max-concurrent``, ``--seed``,
    ``--tracking-uri`` and ``--experiment`` are fixed when the search starts, so a different value is refused (MLflow's
    environment variables do not apply: the search goes on where it started).
    """
    saved = record["settings"]
    for key, value in options.settings.items():
        if key not in RESUMABLE_SETTINGS and value != saved.get(key):
            _refuse(f"--{key.replace('_', '-')} {value}", saved.get(key), name)
    fixed = {
        "num-samples": (options.num_samples, record.get("num_samples", spec.num_samples)),
        "budgets": (_listed(options.budgets), record.get("budgets", _listed(spec.budget_steps))),
        "max-concurrent": (options.max_concurrent, record.get("max_concurrent")),
        "seed": (options.seed, record.get("seed", DEFAULT_SEED)),
        "tracking-uri": (options.tracking_uri, record["tracking_uri"]),
        "experiment": (options.experiment, record.get("experiment", EXPERIMENT)),
    }
    for flag, (given, recorded) in fixed.items():
        if given is not None and given != recorded:
            _refuse(f"--{flag} {given}", recorded, name)
    changed = {k: options.settings[k] for k in RESUMABLE_SETTINGS if options.settings.get(k) is not None}
    settings = FinetuneConfig.from_dict({"augment": RECORDED_AUGMENTATION, **saved, **changed})
    spec = replace(spec, num_samples=fixed["num-samples"][1])
    if fixed["budgets"][1] is not None:
        spec = spec.with_overrides(budgets=fixed["budgets"][1])
    max_failures = _given(options.max_failures, record.get("max_failures", DEFAULT_MAX_FAILURES))
    return SearchPlan(
        spec,
        options,
        name,
        storage,
        record["tracking_uri"],
        settings,
        search_id=record.get("search_id", ""),
        seed=fixed["seed"][1],
        max_failures=max_failures,
        max_concurrent=record.get("max_concurrent"),
        experiment=fixed["experiment"][1],
    )


def _refuse(given: str, recorded: Any, name: str) -> None:
    raise UserError(
        f'{given} differs from the {recorded!r} search "{name}" was started with, and would make its trials '
        "inconsistent; resume without it, or start a new search with another --name"
    )


def _listed(steps) -> list[int] | None:
    return list(steps) if steps else None


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _default_tracking_uri(storage: str) -> str:
    root = Path(storage) if not is_uri(storage) else default_storage()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"
