"""Say what one trial asks of Ray, in Ray's resource names, and whether a node holds it."""

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
    """What one trial asks of Ray, resolved once from the options: the run reads it, never the options.

    ``workers`` is ``--workers-per-trial``, else one per whole GPU; ``placement`` packs or spreads them.
    """

    cpus: float
    gpus: float
    custom: dict[str, float]
    workers: int
    placement: str

    @classmethod
    def of(cls, options: SearchOptions) -> TrialResources:
        """Resolve the resources a search's options give each trial."""
        gpus = options.gpus_per_trial
        workers = options.workers_per_trial or (int(gpus) if gpus > 1 else 1)
        custom = dict(options.resources_per_trial)
        return cls(options.cpus_per_trial, gpus, custom, workers, options.placement)

    @property
    def request(self) -> dict[str, float]:
        """The Ray resources one trial asks for, in Tune's names."""
        return {"cpu": self.cpus, "gpu": self.gpus, **self.custom}

    @property
    def share(self) -> dict[str, float]:
        """One worker's share of a trial of several: 1/N of all but the trial's own process's CPU."""
        n = self.workers
        own = TRIAL_PROCESS_CPU if n > 1 else 0.0
        share = {"cpu": (self.cpus - own) / n, "gpu": self.gpus / n}
        return {**share, **{k: v / n for k, v in self.custom.items()}}

    @property
    def placement_request(self) -> dict[str, float]:
        """What one node must hold for a trial to start: the trial's request, or one worker's share."""
        return self.request if self.workers == 1 else self.share


def address(option: str | None) -> str | None:
    """Return the cluster to join: ``--address``, else ``RAY_ADDRESS``; None (or 'local') starts a local Ray."""
    joining = option or environment.read("RAY_ADDRESS") or None
    return None if joining == "local" else joining


def ray_request(resources: dict[str, float]) -> dict[str, float]:
    """Name Tune's per-trial resources as Ray does, zeros dropped.

    Args:
        resources: The per-trial resources, e.g. ``{"cpu": 1, "gpu": 0.5}``.

    Returns:
        The same request in Ray's names, e.g. ``{"CPU": 1.0, "GPU": 0.5}``.
    """
    names = {"cpu": "CPU", "gpu": "GPU"}
    return {names.get(key, key): float(value) for key, value in resources.items() if value}


def fits(available: dict[str, float], request: dict[str, float], unknown: set[str] = frozenset()) -> bool:
    """Return whether one node with ``available`` resources holds ``request``; ``unknown`` names pass."""
    return all(k in unknown or available.get(k, 0.0) + _EPS >= v for k, v in request.items())


def plain_resources(resources: dict[str, float]) -> dict[str, float]:
    """Return a node's resources without Ray's bookkeeping entries."""
    return {
        k: v for k, v in resources.items() if not k.startswith("node:") and k not in ("memory", "object_store_memory")
    }


def show_resources(resources: dict[str, float]) -> str:
    """Show resources as one short text, names sorted: ``{CPU: 2, GPU: 0.5}``."""
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


def ray_running_here() -> bool:
    """Return whether this process runs a Ray driver already, without importing Ray."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _check_local_fits(resources: dict[str, float]) -> None:
    """Refuse a trial's request that a local Ray on this machine cannot hold, before Ray starts."""
    have = ray_internals.local_resources()
    request = ray_request(resources)
    if have is None or fits(have, request):
        return
    raise UserError(
        f"a trial asks for {show_resources(request)}, more than this machine has for a local Ray instance "
        f"({show_resources(plain_resources(have))}); {LOWER}, or join a cluster that has them with --address"
    )
