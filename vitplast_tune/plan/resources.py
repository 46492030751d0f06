"""What one trial asks of Ray, in Ray's resource names, and whether a node holds it: checked against this machine
before a local Ray instance starts (``check_local_fits``), and against a cluster's nodes once Ray is up
(``run.cluster``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vitplast_tune.plan.options import SearchOptions

from vitplast_tune import environment
from vitplast_tune._compat import ray as ray_internals
from vitplast_tune.errors import UserError

_EPS = 1e-9
CLUSTER_CONFIG_ENV = "VITPLAST_CLUSTER_CONFIG"  # the cluster launcher YAML of a cluster joined (run.cluster reads it)
LOWER = "lower --cpus-per-trial/--gpus-per-trial/--resources-per-trial"
TRIAL_PROCESS_CPU = 0.01  # what a trial of several workers keeps of its CPUs for its own process (Tune needs some)


@dataclass(frozen=True)
class TrialResources:
    """What one trial asks of Ray, resolved once from the options (``of``): the run reads it, never the options.

    Attributes:
        cpus: CPUs per trial (``--cpus-per-trial``).
        gpus: GPUs per trial (``--gpus-per-trial``).
        custom: Custom Ray resources per trial (``--resources-per-trial``).
        workers: The data-parallel workers of one trial: ``--workers-per-trial`` when given, else one per whole GPU.
        placement: Where a trial's workers run: pack or spread.
    """

    cpus: float
    gpus: float
    custom: dict[str, float]
    workers: int
    placement: str

    @classmethod
    def of(cls, options: SearchOptions) -> TrialResources:
        """Resolve the resources a search's options give each trial.

        Args:
            options: The search's ``SearchOptions``.

        Returns:
            The resources (workers: one per whole GPU unless ``workers_per_trial`` is given; one at most 1 GPU).
        """
        gpus = options.gpus_per_trial
        workers = options.workers_per_trial or (int(gpus) if gpus > 1 else 1)
        custom = dict(options.resources_per_trial)
        return cls(options.cpus_per_trial, gpus, custom, workers, options.placement)

    @property
    def request(self) -> dict[str, float]:
        """The Ray resources one trial asks for (Tune's names)."""
        return {"cpu": self.cpus, "gpu": self.gpus, **self.custom}

    @property
    def share(self) -> dict[str, float]:
        """One worker's resources in a trial of several (Tune's names): 1/N of the trial's CPUs but its own
        process's (``TRIAL_PROCESS_CPU``), of its GPUs and of its custom resources."""
        n = self.workers
        own = TRIAL_PROCESS_CPU if n > 1 else 0.0
        share = {"cpu": (self.cpus - own) / n, "gpu": self.gpus / n}
        return {**share, **{k: v / n for k, v in self.custom.items()}}

    @property
    def placement_request(self) -> dict[str, float]:
        """What one node must hold for a trial to start: the trial's resources, or one worker's share of them when
        it has several workers (they may span nodes)."""
        return self.request if self.workers == 1 else self.share


def address(option: str | None) -> str | None:
    """The cluster to join: ``--address``, else ``RAY_ADDRESS``; None (or "local") starts a local Ray instance."""
    joining = option or environment.read("RAY_ADDRESS") or None
    return None if joining == "local" else joining


def ray_request(resources: dict[str, float]) -> dict[str, float]:
    """Name Tune's per-trial resources as Ray does, zeros dropped.

    Args:
        resources: The per-trial resources, e.g. ``{"cpu": 1, "gpu": 0.5, "x": 1}``.

    Returns:
        The same request by Ray's resource names, e.g. ``{"CPU": 1.0, "GPU": 0.5, "x": 1.0}``.
    """
    names = {"cpu": "CPU", "gpu": "GPU"}
    return {names.get(key, key): float(value) for key, value in resources.items() if value}


def fits(available: dict[str, float], request: dict[str, float], unknown: set[str] = frozenset()) -> bool:
    """Whether one node with ``available`` resources holds ``request`` (``unknown`` names pass)."""
    return all(k in unknown or available.get(k, 0.0) + _EPS >= v for k, v in request.items())


def plain_resources(resources: dict[str, float]) -> dict[str, float]:
    """A node's resources without Ray's bookkeeping entries (node:<ip>, memory, object store)."""
    return {
        k: v for k, v in resources.items() if not k.startswith("node:") and k not in ("memory", "object_store_memory")
    }


def show_resources(resources: dict[str, float]) -> str:
    """Show resources as one short text.

    Args:
        resources: The resources, by name.

    Returns:
        The text, names sorted: ``{CPU: 2, GPU: 0.5}``.
    """
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


def ray_running_here() -> bool:
    """Whether this process already runs a Ray driver (``ray.init`` called), without importing Ray."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def check_local_fits(resources: dict[str, float]) -> None:
    """UserError when one trial's request (``--*-per-trial``) is more than a local Ray instance on this machine has:
    before Ray starts, rather than trials that wait for ever."""
    have = ray_internals.local_resources()
    request = ray_request(resources)
    if have is None or fits(have, request):
        return
    raise UserError(
        f"a trial asks for {show_resources(request)}, more than this machine has for a local Ray instance "
        f"({show_resources(plain_resources(have))}); {LOWER}, or join a cluster that has them with --address"
    )
