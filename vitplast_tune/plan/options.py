"""How a search runs (``SearchOptions``: what the command line controls) and the plan it becomes (``SearchPlan``:
everything decided, nothing started), with the defaults of how a search runs.

Defaults have one source each: ``SearchOptions`` for how the search runs (the command line's help reads them),
``config.FinetuneConfig`` for what a trial does (a space file's ``defaults`` and the flags override it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.space.files import SearchSpec
from vitplast_tune.storage import SearchPlace

if TYPE_CHECKING:
    from vitplast_tune.data.decoded import InMemory

EXPERIMENT = "vitplast_tune"  # the MLflow experiment a search logs to unless --experiment or MLFLOW_EXPERIMENT_NAME
# MLflow's own environment variables, honoured as defaults (flags win).
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_SEED = 0
DEFAULT_MAX_FAILURES = 2
DEFAULT_CONNECT_TIMEOUT_S = 30.0


@dataclass
class SearchOptions:
    """How a search runs (what the command line controls); ``settings`` (FinetuneConfig fields) override the space
    file's defaults: a key given is a value, None included (a key left out keeps the space file's).

    ``seed`` and ``max_failures`` left None mean ``DEFAULT_SEED`` and ``DEFAULT_MAX_FAILURES`` for a new
    search, and the recorded values for ``resume``. ``verbose`` 0 prints no progress lines.
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
    workers_per_trial: int = 0  # data-parallel workers of a trial (run/parallel.py); 0: one per GPU, at least one
    placement: str = "pack"  # a trial's workers: on as few nodes as hold them ("pack") or over nodes ("spread")
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

    spec: SearchSpec
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
    def place(self) -> SearchPlace:
        """Where the search keeps its records (what ``records`` takes instead of the whole plan)."""
        return SearchPlace(self.name, self.storage, self.tracking_uri, self.experiment, self.search_id)

    @property
    def location(self) -> str:
        """Where Ray Tune keeps the search: its storage joined with its name (a path, or a URI)."""
        return self.place.location

    @property
    def local_dir(self) -> Path | None:
        """The search's directory when storage is a local path (None for s3:// and the like)."""
        return self.place.local_dir

    @property
    def results_dir(self) -> Path:
        """Where the search's own files (trial table, analysis) go: its directory, else a local one."""
        return self.place.results_dir

    @property
    def max_trainable_params(self) -> int | None:
        """The parameter budget: the option's, else the space file's; trials over it are not trained."""
        return self.options.max_trainable_params or self.spec.max_trainable_params

    def record(self, parent_run_id: str) -> dict[str, Any]:
        """The search's record (``storage.SEARCH_FILE``): what ``--resume`` checks and the offline commands read."""
        return {
            "name": self.name,
            "search_id": self.search_id,
            "space_path": str(self.spec.path),
            "fingerprint": self.spec.fingerprint,
            "tracking_uri": self.tracking_uri,
            "experiment": self.experiment,
            "parent_run_id": parent_run_id,
            "settings": self.settings.to_dict(),
            "num_samples": self.spec.num_samples,
            "budgets": list(self.spec.budget_steps) or None,
            "seed": self.seed,
            "max_concurrent": self.max_concurrent,
            "max_failures": self.max_failures,
        }
