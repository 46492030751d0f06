"""What one trial asks of Ray, in Ray's resource names, and whether a node holds it: checked against this machine
before a local Ray instance starts (``check_local_fits``), and against a cluster's nodes once Ray is up
(``run.cluster``)."""

from __future__ import annotations

import os
import sys

from vitplast_tune._compat import ray as ray_internals
from vitplast_tune.errors import UserError

_EPS = 1e-9
LOWER = "lower --cpus-per-trial/--gpus-per-trial/--resources-per-trial"


def address(option: str | None) -> str | None:
    """The cluster to join: ``--address``, else ``RAY_ADDRESS``; None (or "local") starts a local Ray instance."""
    joining = option or os.environ.get("RAY_ADDRESS") or None
    return None if joining == "local" else joining


def ray_request(resources: dict[str, float]) -> dict[str, float]:
    """Tune's per-trial resources ({"cpu": 1, "gpu": 0.5, "x": 1}) as Ray resource names, zeros dropped."""
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
    """Resources as one short text: ``{CPU: 2, GPU: 0.5}``."""
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
