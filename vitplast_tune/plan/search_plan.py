"""Hold the plan a search's options become: everything decided, nothing started."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.plan.options import (
    DEFAULT_MAX_FAILURES,
    DEFAULT_SEED,
    EXPERIMENT,
    SearchOptions,
    resumed_with,
)
from vitplast_tune.plan.resources import TrialResources
from vitplast_tune.plan.resources import address as cluster_address
from vitplast_tune.space.files import SearchSpec
from vitplast_tune.space.objectives import objective_of
from vitplast_tune.storage import SearchPlace

if TYPE_CHECKING:
    from vitplast_tune.data.decoded import InMemory


@dataclass(frozen=True)
class Running:
    """How a search runs, resolved once from its options: what the run and the analysis read of them.

    ``verbose`` 0 prints no progress. ``address`` is the Ray cluster as given (None: ``RAY_ADDRESS``, else a local Ray);
    ``joining`` is the cluster it joins, resolved once (None: a local Ray of its own). ``max_trainable_params`` None
    takes the space file's budget; ``plasticity_pairs`` None measures every pair. ``resume_flags`` are the words the
    resume command repeats, which the record does not hold.
    """

    resume: bool
    verbose: int
    address: str | None
    joining: str | None
    connect_timeout_s: float
    resources: TrialResources
    max_trainable_params: int | None
    plasticity: bool
    plasticity_variant: str
    plasticity_reference: str
    plasticity_pairs: int | None
    resume_flags: tuple[str, ...]

    @property
    def reference(self) -> str | None:
        """The dataset plasticity is measured against; None when it is not measured."""
        return self.plasticity_reference if self.plasticity else None

    @classmethod
    def of(cls, options: SearchOptions) -> Running:
        """Resolve how a search runs from its options."""
        o, again = options, resumed_with(options)
        if not o.plasticity:  # the plasticity options then do not matter
            flags = o.words(["plasticity"]) + o.words([n for n in again if not n.startswith("plasticity")])
        else:
            flags = o.words(again)
        return cls(
            o.resume,
            o.verbose,
            o.address,
            cluster_address(o.address),
            o.connect_timeout_s,
            TrialResources.of(o),
            o.max_trainable_params,
            o.plasticity,
            o.plasticity_variant,
            o.plasticity_reference,
            o.plasticity_pairs,
            tuple(flags),
        )


@dataclass(frozen=True)
class SearchPlan:
    """A validated search: everything decided, nothing started.

    ``plan.planner.prepare`` makes it once; the run, the records and the analysis read it and never change it.

    Attributes:
        spec: The space, with the options' overrides and its scheduler fitted to the budget.
        running: How it runs.
        name: The search's name.
        storage: Where Ray Tune keeps it: a local folder or a URI.
        tracking_uri: The MLflow tracking URI of its runs.
        settings: What every trial does, before its sampled parameters.
        decoded: A small dataset decoded once for every trial (None: each trial loads its own).
        search_id: The id that tags the MLflow parent run.
        seed: The seed of the search algorithm.
        max_failures: Retries of a trial that crashes.
        max_concurrent: The most trials at once (None: as many as resources allow).
        notes: Adjustments the user is told once.
        experiment: The MLflow experiment of its runs.
        corners: The settings of the trials at the space's corners.
    """

    spec: SearchSpec
    running: Running
    name: str
    storage: str
    tracking_uri: str
    settings: FinetuneConfig
    decoded: InMemory | None = None
    search_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    seed: int = DEFAULT_SEED
    max_failures: int = DEFAULT_MAX_FAILURES
    max_concurrent: int | None = None
    notes: tuple[str, ...] = ()
    experiment: str = EXPERIMENT
    corners: tuple[FinetuneConfig, ...] = ()

    @property
    def place(self) -> SearchPlace:
        """Where the search keeps its records, which ``records`` takes instead of the plan."""
        return SearchPlace(self.name, self.storage, self.tracking_uri, self.experiment, self.search_id)

    @property
    def location(self) -> str:
        """Where Ray Tune keeps the search: its storage joined with its name."""
        return self.place.location

    @property
    def local_dir(self) -> Path | None:
        """The search's folder when its storage is a local path; None for a URI."""
        return self.place.local_dir

    @property
    def results_dir(self) -> Path:
        """Where the search's own files go: its folder, else a local one."""
        return self.place.results_dir

    @property
    def max_trainable_params(self) -> int | None:
        """The parameter budget: the option's, else the space file's."""
        return self.running.max_trainable_params or self.spec.max_trainable_params

    def record(self, parent_run_id: str) -> dict[str, Any]:
        """Make the search's record, which ``--resume`` checks and the offline commands read.

        Args:
            parent_run_id: The id of the search's MLflow parent run.

        Returns:
            The record, ready for JSON.
        """
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
            "objective": objective_of(self.spec),  # what a resume optimises, whatever --objective it is given
            "finalists": {"top": self.spec.finalists.top, "seeds": self.spec.finalists.seeds},
            "baselines": self.spec.baselines,  # rates per baseline of its reference trials
            "seed": self.seed,
            "max_concurrent": self.max_concurrent,
            "max_failures": self.max_failures,
            "workers_per_trial": self.running.resources.workers,  # a resume must give its trials as many
        }
