"""Joining a Ray cluster, storage that every node reaches, requests that can never be scheduled, and running
the measurements in one Ray worker where the trials' accelerators are.

``connect(address)`` joins a running cluster (``--address``, else ``RAY_ADDRESS``) and turns the
usual failures (unreachable, token authentication refused) into one-line UserErrors.
``check_trial_fits(resources)`` runs on the driver after Ray is up and before anything is recorded:

* a node of the cluster has the per-trial resources now: fine;
* else, when the cluster's node types are known, one of them has them: fine (the autoscaler adds
  such a node), none has: UserError. Node types come from, in order, ``$VITPLAST_CLUSTER_CONFIG``
  (a cluster launcher YAML), ``~/ray_bootstrap_config.yaml`` (the head of a ``ray up`` cluster,
  where ``ray submit``/``ray job submit`` run the driver) or the cluster config that autoscaler v2
  (the default on KubeRay) keeps in the GCS, when there is one;
* else, when the autoscaler reports only fixed nodes (``ray start`` without an autoscaling
  config): UserError; when it autoscales with node types unknown here, or has not reported within
  15 s: a warning, and trials wait as Tune makes them.

``preflight`` then checks, on a cluster, that a local ``--storage`` path is one every node that runs trials
sees (a marker the driver wrote, read on each node; else UserError: use a URI such as s3://), and which files
of the driver's disk the trials need elsewhere (``data.staging``).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from vitplast_tune import environment
from vitplast_tune._compat import ray as ray_internals
from vitplast_tune.errors import UserError
from vitplast_tune.log import get_logger
from vitplast_tune.plan import resources

log = get_logger(__name__)

CONFIG_ENV = resources.CLUSTER_CONFIG_ENV  # checked in the plan too (plan.checks._check_environment)
BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"
# A local instance starts no idle workers ahead of time: Ray would start one per CPU when the driver connects, each
# holding memory for nothing, and trials are actors that start their own worker anyway.
LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}


# ----------------------------------------------------------------------------- joining


def init(option: str | None, timeout_s: float = 30.0) -> None:
    """Join the cluster at ``--address`` (else ``RAY_ADDRESS``), saying so, or start a local Ray instance of this
    search's own (without a dashboard), whatever clusters the machine runs or Ray's temp dir remembers."""
    join_or_start(resources.address(option), timeout_s, option)


def join_or_start(joining: str | None, timeout_s: float = 30.0, option: str | None = None) -> None:
    """``init`` with the cluster already resolved: join ``joining`` (given as ``option``, else read from
    ``RAY_ADDRESS``), or start a local Ray instance when it is None."""
    import ray

    runtime_env = {"env_vars": {"PYTHONWARNINGS": "ignore::DeprecationWarning"}}
    if joining:
        source = "--address" if option else "RAY_ADDRESS"
        log.info(
            f"Joining the Ray cluster at {joining} ({source}); without it the search starts a Ray instance of its own"
        )
        wait_for_head(joining, timeout_s)  # UserError when nothing answers there in time
        connect(joining, runtime_env=runtime_env, log_to_driver=False)  # UserError when refused or unreachable
    else:
        # address="local": a new instance even when a `ray start` cluster (live, or dead and remembered in
        # ray_current_cluster) is on this machine, which ray.init() would join, and refuse _system_config for.
        ray.init(
            address="local",
            include_dashboard=False,
            runtime_env=runtime_env,
            log_to_driver=False,
            configure_logging=False,
            _system_config=LOCAL_SYSTEM_CONFIG,
        )


def head_endpoint(joining: str) -> tuple[str, int] | None:
    """(host, port) of a cluster address (``host:port``, ``ray://host:port``), or None when it names none ("auto")."""
    rest = joining.split("://", 1)[-1].rstrip("/")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def wait_for_head(joining: str, timeout_s: float = 30.0) -> None:
    """Wait up to ``timeout_s`` for something to accept a connection at the cluster's address (a head starting up
    may refuse for a moment); UserError with the reason and what to check when nothing does."""
    endpoint = head_endpoint(joining)
    if endpoint is None:
        return
    deadline, reason = time.monotonic() + timeout_s, "no answer"
    while True:
        try:
            with socket.create_connection(endpoint, timeout=max(0.5, min(5.0, deadline - time.monotonic()))):
                return
        except socket.gaierror as exc:
            reason = exc.strerror or exc
            raise UserError(
                f"cannot join the Ray cluster at {joining}: unknown host {endpoint[0]} ({reason})"
            ) from None
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(1.0, left))
    raise UserError(
        f"cannot join the Ray cluster at {joining}: nothing answered at {endpoint[0]}:{endpoint[1]} within "
        f"{timeout_s:g} s ({reason}); check that its head is up (`ray status --address {endpoint[0]}:{endpoint[1]}` "
        "there), the port (the head's --port, 6379 by default; ray://HOST:10001 for Ray Client) and firewalls, "
        "or drop --address / RAY_ADDRESS to run on this machine (--connect-timeout sets the wait)"
    )


def connect(address: str, **init_kwargs: Any) -> None:
    """``ray.init(address=...)``, with a clear UserError when the cluster cannot be joined."""
    import ray

    try:
        ray.init(address=address, **init_kwargs)
    except Exception as exc:
        raise _join_error(address, exc) from None


def _join_error(address: str, exc: BaseException) -> UserError:
    chain, cause = [], exc
    while cause is not None and len(chain) < 8:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    text = " ".join(f"{type(e).__name__}: {e}" for e in chain)
    if any(type(e).__name__ == "AuthenticationError" for e in chain) or "InvalidAuthToken" in text:
        mode = environment.read("RAY_AUTH_MODE", "unset")
        return UserError(
            f"the Ray cluster at {address} refused this driver: it uses token authentication "
            f"(RAY_AUTH_MODE here is {mode}). Set RAY_AUTH_MODE=token and give the cluster's token in "
            "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (see docs/cluster.md)"
        )
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return UserError(
        f"cannot join the Ray cluster at {address} ({first}); check --address / RAY_ADDRESS and that the head is up"
    )


# ----------------------------------------------------------------------------- the trial request


def alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def node_types() -> tuple[str, dict[str, dict[str, float]]] | None:
    """(where from, {node type: resources}) of the types the autoscaler may add, or None when unknown."""
    given = environment.read(CONFIG_ENV)
    if given and not Path(given).expanduser().is_file():
        raise UserError(f"{CONFIG_ENV}={given} is not a file; point it at the cluster launcher YAML")
    for path in (given, BOOTSTRAP_CONFIG):
        if path and Path(path).expanduser().is_file():
            return str(path), _launcher_node_types(Path(path).expanduser())
    return _gcs_node_types()


def _launcher_node_types(path: Path) -> dict[str, dict[str, float]]:
    import yaml

    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read the cluster config {path}: {exc}") from None
    types = config.get("available_node_types") or {}
    head = config.get("head_node_type")
    return {
        name: dict(t.get("resources") or {})
        for name, t in types.items()
        if name == head or t.get("max_workers", 1) != 0
    }


def _gcs_node_types() -> tuple[str, dict[str, dict[str, float]]] | None:
    groups = ray_internals.cluster_node_groups()
    return None if groups is None else ("the autoscaler's cluster config", groups)


def autoscales(wait_s: float = 0.0) -> bool | None:
    """Whether the cluster's autoscaler manages node types (None: no autoscaler report, even after ``wait_s``).

    A cluster started with plain ``ray start`` runs the autoscaler with a read-only provider whose
    node types are the nodes themselves ("node_<id>"); any other type name means real node types.
    The autoscaler reports every few seconds, so a cluster that just started may need ``wait_s``.
    """
    deadline = time.monotonic() + wait_s
    while (found := _autoscales()) is None and time.monotonic() < deadline:
        time.sleep(1.0)
    return found


def _autoscales() -> bool | None:
    mapping = ray_internals.autoscaler_node_types()
    return None if not mapping else any(not str(t).startswith("node_") for t in mapping.values())


def started_here() -> bool:
    """Whether this process started the Ray instance it uses (``ray.init()`` without an address): one fixed node."""
    return ray_internals.started_here()


def check_trial_fits(trial: dict[str, float]) -> str:
    """Raise UserError when no node, and no node type the cluster can add, holds one trial's resources.

    Returns how the request is satisfied ("node", "node type", "autoscaler (unchecked)"), for tests.
    """
    request = resources.ray_request(trial)
    nodes = alive_nodes()
    if any(resources.fits(n.get("Resources", {}), request) for n in nodes):
        return "node"
    shown = resources.show_resources(request)
    have = (
        "; ".join(sorted({resources.show_resources(resources.plain_resources(n.get("Resources", {}))) for n in nodes}))
        or "none"
    )
    types = node_types()
    if types is not None:
        source, found = types
        # A node type without a CPU count (a launcher YAML that leaves it to `ray up`) is not judged on CPU/GPU.
        ok = [
            name
            for name, res in found.items()
            if resources.fits(res, request, set() if "CPU" in res else {"CPU", "GPU"})
        ]
        if ok:
            log.info(
                f"No node has {shown} yet; the autoscaler can add node type(s) {', '.join(ok)} ({source}); "
                "trials wait for it."
            )
            return "node type"
        listed = "; ".join(f"{name}: {resources.show_resources(res)}" for name, res in found.items()) or "none"
        raise UserError(
            f"a trial asks for {shown}, which no node and no node type of the cluster has (nodes: {have}; "
            f"node types from {source}: {listed}); lower --cpus-per-trial/--gpus-per-trial/--resources-per-trial "
            "or add a node type that has them"
        )
    if started_here():
        raise UserError(
            f"a trial asks for {shown}, more than this machine's local Ray instance has ({have}); lower "
            "--cpus-per-trial/--gpus-per-trial/--resources-per-trial, or join a cluster with --address"
        )
    scaling = autoscales(wait_s=15.0)
    if scaling is None or scaling:
        what = "the cluster autoscales with node types unknown here" if scaling else "the autoscaler has not reported"
        log.info(
            f"No node has {shown} yet and {what}, so trials wait for a node that has it "
            f"(set {CONFIG_ENV} to the cluster YAML to check the request up front)."
        )
        return "autoscaler (unchecked)"
    raise UserError(
        f"a trial asks for {shown}, which no node of the cluster has (nodes: {have}) and the cluster does not "
        "autoscale; lower --cpus-per-trial/--gpus-per-trial/--resources-per-trial or start nodes that have them "
        f"(for an autoscaling cluster whose node types are not known here, set {CONFIG_ENV} to its YAML)"
    )
