"""The plan of a search: the space file, the flags and the files they name, validated into one typed
object before anything starts (no Ray, no MLflow run, no model download).

Defaults have one source each: ``SearchOptions`` for how the search runs (the command line's help
reads them), ``training.FinetuneConfig`` for what a trial does (a space file's ``defaults`` and the
flags override it). Every problem is a ``UserError``: one line, exit code 2.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from vitplast_tune import data, models, spaces
from vitplast_tune.errors import UserError
from vitplast_tune.trial import trial_config

SEARCH_FILE = "vitplast_search.json"  # the record of a search in its directory
EXPERIMENT = "vitplast_tune"  # the MLflow experiment every search logs to


@dataclass
class SearchOptions:
    """How a search runs (what the command line controls); ``settings`` override the space file's defaults."""

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
    seed: int = 0
    resume: bool = False
    max_failures: int = 2
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
    settings: dict[str, Any]
    decoded: data.InMemory | None = None  # a small dataset, decoded once for every trial

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


def default_storage() -> Path:
    """Where searches are stored when ``--storage`` is not given: ``~/vitplast_tune_results``."""
    return Path.home() / "vitplast_tune_results"


def is_uri(path: str) -> bool:
    """Whether a storage location is a URI (s3://, gs://, ...) rather than a local path."""
    return "://" in path


def prepare(options: SearchOptions) -> SearchPlan:
    """Validate the space, settings, resources and paths into a plan; raise UserError on the first problem."""
    spec = spaces.load_space(options.space).with_overrides(num_samples=options.num_samples)
    settings = _settings(spec, options)
    _check_resources(options)
    decoded = _check_data(settings)
    if options.plasticity:
        from vitplast_tune.plasticity import VARIANTS

        if options.plasticity_variant not in VARIANTS:
            raise UserError(f'unknown plasticity variant "{options.plasticity_variant}"; use one of {", ".join(VARIANTS)}')
        data.check_dataset_name(options.plasticity_reference)
    from vitplast_tune.cluster import storage_uri  # cluster: s3://, gs://, ... checked; file:// made a path

    storage = storage_uri(str(options.storage or default_storage()))
    if not is_uri(storage):
        storage = str(Path(storage).expanduser().resolve())
        _check_writable(Path(storage))
    name = options.name or f"{spec.name}-{datetime.now():%Y%m%d-%H%M%S}"
    if "/" in name or name.startswith("."):
        raise UserError(f'--name "{name}" must be a plain directory name')
    tracking_uri = options.tracking_uri or _default_tracking_uri(storage)
    plan = SearchPlan(spec, options, name, storage, tracking_uri, settings, decoded)
    _check_resume(plan)
    return plan


def write_record(plan: SearchPlan, parent_run_id: str) -> None:
    """Write the search's record (space fingerprint, settings, MLflow parent run) that ``--resume`` checks."""
    directory = plan.local_dir
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    record = {"name": plan.name, "space_path": str(plan.spec.path), "fingerprint": plan.spec.fingerprint,
              "tracking_uri": plan.tracking_uri, "parent_run_id": parent_run_id, "settings": plan.settings}  # fmt: skip
    (directory / SEARCH_FILE).write_text(json.dumps(record, indent=2, default=str))


def read_record(directory: Path) -> dict[str, Any]:
    """The record of the search stored in ``directory``; UserError when there is none."""
    path = directory / SEARCH_FILE
    if not path.is_file():
        raise UserError(f'no search "{directory.name}" in {directory.parent}; check --name and --storage')
    return json.loads(path.read_text())


def _settings(spec: spaces.SearchSpec, options: SearchOptions) -> dict[str, Any]:
    """The trial settings: FinetuneConfig defaults < space defaults < command line; all validated."""
    from vitplast_tune.training import FinetuneConfig

    overrides = {k: v for k, v in options.settings.items() if v is not None}
    try:
        base = FinetuneConfig.from_dict({**spec.defaults, **overrides})
        base.seed = overrides.get("seed", spec.defaults.get("seed", options.seed))
        if not base.threads:
            base.threads = max(1, int(options.cpus_per_trial))
        settings = base.to_dict()
        for config in spec.corner_configs():
            trial_config(config, settings).validate()
    except UserError as exc:
        raise UserError(f"{exc} (settings from {spec.path.name} and the command line)") from None
    return settings


def _check_data(settings: dict[str, Any]) -> data.InMemory | None:
    """Check the model, its weights file and the dataset; return a small dataset decoded once.

    The decoded dataset (None for datasets read lazily from disk) is shared with every trial
    through the object store, so it is decoded here and nowhere else on the driver.
    """
    config = models.pretrained_data_config(settings["model"])
    models.check_weights(settings["model"], settings["weights"], settings["pretrained"])
    data.num_classes(settings["dataset"], settings.get("data_dir"))
    return data.decode_dataset(settings["dataset"], config, data_dir=settings.get("data_dir"), download=settings["download"])


def _check_resources(options: SearchOptions) -> None:
    if options.cpus_per_trial < 0 or options.gpus_per_trial < 0:
        raise UserError("--cpus-per-trial and --gpus-per-trial must not be negative")
    if options.cpus_per_trial == 0 and options.gpus_per_trial == 0 and not options.resources_per_trial:
        raise UserError("a trial needs some resource: give --cpus-per-trial or --gpus-per-trial above 0")
    if options.gpus_per_trial > 1 and not float(options.gpus_per_trial).is_integer():
        raise UserError("--gpus-per-trial above 1 must be a whole number")
    if any(v < 0 for v in options.resources_per_trial.values()):
        raise UserError("custom resources per trial must not be negative")
    if options.max_concurrent is not None and options.max_concurrent < 1:
        raise UserError("--max-concurrent must be at least 1")
    if options.max_failures < 0:
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


def _check_resume(plan: SearchPlan) -> None:
    directory = plan.local_dir
    if directory is None:
        return
    if plan.options.resume:
        saved = read_record(directory)
        if saved["fingerprint"] != plan.spec.fingerprint:
            raise UserError(
                f'search "{plan.name}" was started with a different space file ({saved["space_path"]}); '
                "resume it with that file, or start a new search with another --name"
            )
    elif (directory / SEARCH_FILE).exists():
        raise UserError(f'search "{plan.name}" already exists in {plan.storage}; pass --resume to continue it, or another --name')


def _default_tracking_uri(storage: str) -> str:
    root = Path(storage) if not is_uri(storage) else default_storage()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"
