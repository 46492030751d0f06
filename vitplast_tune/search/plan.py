"""The plan of a search: the space file, the flags and the files they name, validated into one typed
object before anything starts (no Ray, no MLflow run, no model download).

Defaults have one source each: ``SearchOptions`` for how the search runs (the command line's help
reads them), ``training.FinetuneConfig`` for what a trial does (a space file's ``defaults`` and the
flags override it). Every problem is a ``UserError``: one line, exit code 2.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplast_tune.config import FinetuneConfig, check_variant
from vitplast_tune.errors import UserError, did_you_mean
from vitplast_tune.search import spaces
from vitplast_tune.search.trial import METRICS, trial_config
from vitplast_tune.storage import SEARCH_FILE, default_storage, is_uri, join, read_record, storage_uri

if TYPE_CHECKING:
    from vitplast_tune.data.decoded import InMemory

EXPERIMENT = "vitplast_tune"  # the MLflow experiment every search logs to
DEFAULT_SEED = 0
DEFAULT_MAX_FAILURES = 2
# Settings a resumed search may change: where the data comes from, not what the trials do.
RESUMABLE_SETTINGS = ("download",)


@dataclass
class SearchOptions:
    """How a search runs (what the command line controls); ``settings`` override the space file's defaults.

    ``seed`` and ``max_failures`` left None mean ``DEFAULT_SEED`` and ``DEFAULT_MAX_FAILURES`` for a new
    search, and the recorded values for ``resume``.
    """

    space: str = "component_subsets"
    name: str | None = None
    storage: str | None = None
    tracking_uri: str | None = None
    address: str | None = None
    num_samples: int | None = None
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
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
    spec = spaces.load_space(options.space).with_overrides(num_samples=options.num_samples)
    _check_metric(spec)
    _check_resources(options)
    storage = storage_uri(str(options.storage or default_storage()))
    if not is_uri(storage):
        storage = str(Path(storage).expanduser().resolve())
        _check_writable(Path(storage))
    name = options.name or f"{spec.name}-{datetime.now():%Y%m%d-%H%M%S}"
    if "/" in name or name.startswith("."):
        raise UserError(f'--name "{name}" must be a plain directory name')
    record = _resume_record(spec, options, storage, name)
    if record is None:
        settings = _settings(spec, options)
        plan = SearchPlan(
            spec,
            options,
            name,
            storage,
            options.tracking_uri or _default_tracking_uri(storage),
            settings,
            seed=_given(options.seed, DEFAULT_SEED),
            max_failures=_given(options.max_failures, DEFAULT_MAX_FAILURES),
            max_concurrent=options.max_concurrent,
        )
    else:
        plan = _resumed_plan(spec, options, storage, name, record)
    plan.spec, plan.notes = fit_scheduler(plan.spec, plan.settings.max_steps)
    _check_plasticity(options)
    plan.decoded = _check_inputs(plan.settings, options.plasticity_reference if options.plasticity else None)
    return plan


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
        "parent_run_id": parent_run_id,
        "settings": plan.settings.to_dict(),
        "num_samples": plan.spec.num_samples,
        "seed": plan.seed,
        "max_concurrent": plan.max_concurrent,
        "max_failures": plan.max_failures,
    }
    (directory / SEARCH_FILE).write_text(json.dumps(record, indent=2, default=str))


def _settings(spec: spaces.SearchSpec, options: SearchOptions) -> FinetuneConfig:
    """The trial settings: FinetuneConfig defaults < space defaults < command line; all validated."""
    overrides = {k: v for k, v in options.settings.items() if v is not None}
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


def _check_plasticity(options: SearchOptions) -> None:
    if options.plasticity:
        check_variant(options.plasticity_variant)


def _check_inputs(settings: FinetuneConfig, reference: str | None) -> InMemory | None:
    """Check the model, its weights file, the dataset and the plasticity reference (None: none); return a small
    dataset decoded once (``_inspect_inputs``).

    That takes torch, timm and torchvision, 0.4 GB that a process keeps once it has imported them, and after
    this only trials and measurements (Ray workers) need them. So when this process has not imported torch
    (the command line), the checks run in a short-lived Python process: the driver holds none of it while
    trials run.
    A UserError there is raised here; any other failure prints its traceback and raises RuntimeError here.
    """
    if "torch" in sys.modules:
        return _inspect_inputs(settings, reference)
    with tempfile.TemporaryDirectory(prefix="vitplast-inputs-") as tmp:
        exchange = Path(tmp) / "inputs.pkl"  # in: (settings, reference); out: (ok, decoded or UserError)
        exchange.write_bytes(pickle.dumps((settings, reference)))
        code = "import sys; from vitplast_tune.search.plan import _inspect_in_child; _inspect_in_child(sys.argv[1])"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's imports
        child = subprocess.run([sys.executable, "-c", code, str(exchange)], env=env)
        if child.returncode != 0:
            raise RuntimeError(f"checking the search's inputs failed in a child process (exit {child.returncode})")
        ok, value = pickle.loads(exchange.read_bytes())
    if not ok:
        raise value
    return value


def _inspect_in_child(path: str) -> None:
    """``_inspect_inputs`` of the arguments pickled in ``path``; its result (or UserError) pickled back there."""
    exchange = Path(path)
    settings, reference = pickle.loads(exchange.read_bytes())
    try:
        result = (True, _inspect_inputs(settings, reference))
    except UserError as exc:
        result = (False, exc)
    exchange.write_bytes(pickle.dumps(result))


def _inspect_inputs(settings: FinetuneConfig, reference: str | None) -> InMemory | None:
    """``_check_inputs`` in this process. The decoded dataset (None for datasets read lazily from disk) is
    shared with every trial through the object store, so it is decoded here and nowhere else on the driver.
    """
    from vitplast_tune.data import datasets
    from vitplast_tune.vit import models

    config = models.pretrained_data_config(settings.model)
    models.check_weights(settings.model, settings.weights, settings.pretrained)
    datasets.num_classes(settings.dataset, settings.data_dir)
    image_cache = settings.image_cache
    if 0 < image_cache < max(config["input_size"][1:]):
        raise UserError(
            f"image_cache {image_cache} is below the model's input size {config['input_size'][-1]} px, so every image "
            f"would be enlarged again; use at least {round(config['input_size'][-1] / config.get('crop_pct', 1.0))} "
            "(the model's resize size), or 0 to decode the JPEGs each time"
        )
    if reference is not None:
        datasets.check_dataset_name(reference)
    return datasets.decode_dataset(
        settings.dataset,
        config,
        data_dir=settings.data_dir,
        download=settings.download,
        image_cache=image_cache,
    )


def _check_resources(options: SearchOptions) -> None:
    if options.cpus_per_trial < 0 or options.gpus_per_trial < 0:
        raise UserError("--cpus-per-trial and --gpus-per-trial must not be negative")
    if options.cpus_per_trial == 0 and options.gpus_per_trial == 0 and not options.resources_per_trial:
        raise UserError("a trial needs some resource: give --cpus-per-trial or --gpus-per-trial above 0")
    if options.gpus_per_trial > 1:
        raise UserError(
            f"--gpus-per-trial {options.gpus_per_trial:g}: a trial trains on one GPU (no data parallelism), so more "
            "would sit idle; give 1, or a fraction such as 0.5 to share a GPU, and run more trials at once instead"
        )
    if any(v < 0 for v in options.resources_per_trial.values()):
        raise UserError("custom resources per trial must not be negative")
    if options.max_concurrent is not None and options.max_concurrent < 1:
        raise UserError("--max-concurrent must be at least 1")
    if options.max_failures is not None and options.max_failures < 0:
        raise UserError("--max-failures must not be negative")
    if options.max_trainable_params is not None and options.max_trainable_params < 1:
        raise UserError("the parameter budget (max_trainable_params) must be a positive number of parameters")


def _check_writable(path: Path) -> None:
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

    ``--max-failures`` applies to the remaining trials; ``--num-samples``, ``--max-concurrent``, ``--seed``
    and ``--tracking-uri`` are fixed when the search starts, so a different value is refused.
    """
    saved = record["settings"]
    for key, value in options.settings.items():
        if value is not None and key not in RESUMABLE_SETTINGS and value != saved.get(key):
            _refuse(f"--{key.replace('_', '-')} {value}", saved.get(key), name)
    fixed = {
        "num-samples": (options.num_samples, record.get("num_samples", spec.num_samples)),
        "max-concurrent": (options.max_concurrent, record.get("max_concurrent")),
        "seed": (options.seed, record.get("seed", DEFAULT_SEED)),
        "tracking-uri": (options.tracking_uri, record["tracking_uri"]),
    }
    for flag, (given, recorded) in fixed.items():
        if given is not None and given != recorded:
            _refuse(f"--{flag} {given}", recorded, name)
    changed = {k: options.settings[k] for k in RESUMABLE_SETTINGS if options.settings.get(k) is not None}
    settings = FinetuneConfig.from_dict({**saved, **changed})
    spec = replace(spec, num_samples=fixed["num-samples"][1])
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
    )


def _refuse(given: str, recorded: Any, name: str) -> None:
    raise UserError(
        f'{given} differs from the {recorded!r} search "{name}" was started with, and would make its trials '
        "inconsistent; resume without it, or start a new search with another --name"
    )


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _default_tracking_uri(storage: str) -> str:
    root = Path(storage) if not is_uri(storage) else default_storage()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"
