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

import contextlib
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitplast_tune.data import staging
from vitplast_tune.errors import UserError
from vitplast_tune.storage import is_uri

CONFIG_ENV = "VITPLAST_CLUSTER_CONFIG"
BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"
_EPS = 1e-9
# A local instance starts no idle workers ahead of time: Ray would start one per CPU (50 MB each here) when
# the driver connects, and trials are actors that start their own worker anyway.
LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}


# ----------------------------------------------------------------------------- joining


def address(option: str | None) -> str | None:
    """The cluster to join: ``--address``, else ``RAY_ADDRESS``; None (or "local") starts a local Ray instance."""
    joining = option or os.environ.get("RAY_ADDRESS") or None
    return None if joining == "local" else joining


def init(option: str | None, timeout_s: float = 30.0, say=print) -> None:
    """Join the cluster at ``--address`` (else ``RAY_ADDRESS``), saying so, or start a local Ray instance of this
    search's own (without a dashboard), whatever clusters the machine runs or Ray's temp dir remembers."""
    import ray

    joining = address(option)
    runtime_env = {"env_vars": {"PYTHONWARNINGS": "ignore::DeprecationWarning"}}
    if joining:
        source = "--address" if option else "RAY_ADDRESS"
        say(f"Joining the Ray cluster at {joining} ({source}); without it the search starts a Ray instance of its own")
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
        mode = os.environ.get("RAY_AUTH_MODE", "unset")
        return UserError(
            f"the Ray cluster at {address} refused this driver: it uses token authentication "
            f"(RAY_AUTH_MODE here is {mode}). Set RAY_AUTH_MODE=token and give the cluster's token in "
            "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (see docs/cluster.md)"
        )
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return UserError(
        f"cannot join the Ray cluster at {address} ({first}); check --address / RAY_ADDRESS and that the head is up"
    )


# ----------------------------------------------------------------------------- resources


def ray_request(resources: dict[str, float]) -> dict[str, float]:
    """Tune's per-trial resources ({"cpu": 1, "gpu": 0.5, "x": 1}) as Ray resource names, zeros dropped."""
    names = {"cpu": "CPU", "gpu": "GPU"}
    request: dict[str, float] = {}
    for key, value in resources.items():
        if value:
            request[names.get(key, key)] = float(value)
    return request


def fits(available: dict[str, float], request: dict[str, float], unknown: set[str] = frozenset()) -> bool:
    """Whether one node with ``available`` resources holds ``request`` (``unknown`` names pass)."""
    return all(k in unknown or available.get(k, 0.0) + _EPS >= v for k, v in request.items())


def alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def node_types() -> tuple[str, dict[str, dict[str, float]]] | None:
    """(where from, {node type: resources}) of the types the autoscaler may add, or None when unknown."""
    given = os.environ.get(CONFIG_ENV)
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
    try:
        import ray._private.state

        config = ray._private.state.state.get_cluster_config()
    except Exception:
        return None
    if config is None or not config.node_group_configs:
        return None
    types = {g.name: dict(g.resources) for g in config.node_group_configs if g.max_count != 0}
    return "the autoscaler's cluster config", types


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
    try:
        from ray._private import ray_constants
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    except Exception:
        return None
    if not raw:
        return None
    mapping = (json.loads(raw).get("autoscaler_report") or {}).get("node_type_mapping") or {}
    if not mapping:
        return None
    return any(not str(t).startswith("node_") for t in mapping.values())


def ray_running_here() -> bool:
    """Whether this process already runs a Ray driver (``ray.init`` called), without importing Ray."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def local_resources() -> dict[str, float] | None:
    """The resources a local Ray instance would have on this machine (CPUs, GPUs and accelerators as Ray detects
    them, RAY_OVERRIDE_RESOURCES included), known before it starts; None when Ray cannot tell."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        spec = ResourceAndLabelSpec().resolve(is_head=True)
    except Exception:
        return None
    found = {"CPU": float(spec.num_cpus or 0), "GPU": float(spec.num_gpus or 0)}
    return {**found, **{k: float(v) for k, v in (spec.resources or {}).items()}}


def check_local_fits(resources: dict[str, float]) -> None:
    """UserError when one trial's request (``--*-per-trial``) is more than a local Ray instance on this machine has:
    before Ray starts, rather than trials that wait for ever."""
    have = local_resources()
    request = ray_request(resources)
    if have is None or fits(have, request):
        return
    raise UserError(
        f"a trial asks for {show_resources(request)}, more than this machine has for a local Ray instance "
        f"({show_resources(plain_resources(have))}); lower --cpus-per-trial/--gpus-per-trial/--resources-per-trial, or join a cluster "
        "that has them with --address"
    )


def started_here() -> bool:
    """Whether this process started the Ray instance it uses (``ray.init()`` without an address): one fixed node."""
    try:
        import ray._private.worker

        node = ray._private.worker._global_node
        return node is not None and node.is_head()
    except Exception:
        return False


def check_trial_fits(resources: dict[str, float], say=print) -> str:
    """Raise UserError when no node, and no node type the cluster can add, holds one trial's resources.

    Returns how the request is satisfied ("node", "node type", "autoscaler (unchecked)"), for tests.
    """
    request = ray_request(resources)
    nodes = alive_nodes()
    if any(fits(n.get("Resources", {}), request) for n in nodes):
        return "node"
    shown = show_resources(request)
    have = "; ".join(sorted({show_resources(plain_resources(n.get("Resources", {}))) for n in nodes})) or "none"
    types = node_types()
    if types is not None:
        source, found = types
        # A node type without a CPU count (a launcher YAML that leaves it to `ray up`) is not judged on CPU/GPU.
        ok = [name for name, res in found.items() if fits(res, request, set() if "CPU" in res else {"CPU", "GPU"})]
        if ok:
            say(
                f"No node has {shown} yet; the autoscaler can add node type(s) {', '.join(ok)} ({source}); "
                "trials wait for it."
            )
            return "node type"
        listed = "; ".join(f"{name}: {show_resources(res)}" for name, res in found.items()) or "none"
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
        say(
            f"No node has {shown} yet and {what}, so trials wait for a node that has it "
            f"(set {CONFIG_ENV} to the cluster YAML to check the request up front)."
        )
        return "autoscaler (unchecked)"
    raise UserError(
        f"a trial asks for {shown}, which no node of the cluster has (nodes: {have}) and the cluster does not "
        "autoscale; lower --cpus-per-trial/--gpus-per-trial/--resources-per-trial or start nodes that have them "
        f"(for an autoscaling cluster whose node types are not known here, set {CONFIG_ENV} to its YAML)"
    )


def plain_resources(resources: dict[str, float]) -> dict[str, float]:
    """A node's resources without Ray's bookkeeping entries (node:<ip>, memory, object store)."""
    return {
        k: v for k, v in resources.items() if not k.startswith("node:") and k not in ("memory", "object_store_memory")
    }


def show_resources(resources: dict[str, float]) -> str:
    """Resources as one short text: ``{CPU: 2, GPU: 0.5}``."""
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


# ----------------------------------------------------------------------------- the measuring worker


def worker_options(resources: dict[str, float]) -> dict[str, Any]:
    """``ray.remote`` options of the measuring worker: a trial's resources (one whole GPU if the trial uses any)."""
    request = ray_request(resources)
    cpus, gpus = request.pop("CPU", 0.0), request.pop("GPU", 0.0)
    return {"num_cpus": cpus, "num_gpus": 1 if gpus else 0, "resources": request, "max_restarts": 0}


class _Worker:
    """The measuring worker's actor: runs the functions it is sent."""

    def call(self, fn, kwargs):
        return fn(**kwargs)


@contextlib.contextmanager
def measuring_worker(resources: dict[str, float], say=print, every_s: float = 30.0) -> Iterator[Callable[..., Any]]:
    """A runner (``runner(fn, **kwargs) -> fn(**kwargs)``) backed by one Ray worker with a trial's resources.

    The measurements before the trials (plasticity, gradient criteria) share its imports (torch, timm) instead of
    each starting a worker; the worker ends with the block, else it would hold torch, the model and what its
    allocator kept (0.5 GB with the testbed ViT) through the search. ``resources`` as ``--*-per-trial`` give them
    ({"cpu": 2, "gpu": 0.5, "a100": 1}). The driver waits, saying every ``every_s`` seconds that a call still runs.
    """
    import ray

    shown = show_resources(ray_request(resources))
    worker = ray.remote(**worker_options(resources))(_Worker).remote()

    def run(fn, **kwargs):
        ref = worker.call.remote(fn, kwargs)
        started = time.monotonic()
        while not ray.wait([ref], timeout=every_s)[0]:
            say(f"  ... still measuring ({time.monotonic() - started:.0f} s, a Ray worker with {shown})", flush=True)
        return ray.get(ref)

    try:
        yield run
    finally:
        ray.kill(worker, no_restart=True)


# ----------------------------------------------------------------------------- what every node sees

PROBE_TIMEOUT_S = 120.0


@dataclass
class Preflight:
    """What the driver found once Ray is up: how a trial's request is met, whether nodes may join later (an
    autoscaler), and the inputs to send to the nodes."""

    how: str
    grows: bool = False
    to_stage: list[staging.Files] = field(default_factory=list)


def preflight(resources: dict[str, float], storage: str, inputs: Sequence[staging.Files] = (), say=print) -> Preflight:
    """The driver's checks once Ray is up, before anything is recorded: the trial request can be scheduled; a local
    ``storage`` path is shown shared (every node that can run a trial reads a marker the driver wrote there); and
    which of ``inputs`` (files on the driver's disk that runs read) must be sent to the nodes (``staging``).
    Nodes an autoscaler adds later cannot be checked now: such a cluster gets every input, and a warning.
    """
    how = check_trial_fits(resources, say)
    if started_here():  # one machine: the driver's own disk
        return Preflight(how)
    grows = how != "node" or autoscales() is not False
    request = ray_request(resources)
    nodes = [n for n in alive_nodes() if fits(n.get("Resources", {}), request)]
    marker = None if is_uri(storage) else Path(storage) / f".vitplast-shared-{uuid.uuid4().hex}"
    try:
        if marker is not None:
            marker.write_text(marker.name)
        views = on_every_node(nodes, _sees, marker=str(marker) if marker else None, inputs=list(inputs))
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)
    if marker is not None:
        _check_storage(storage, views, marker.name, grows, say)
    return Preflight(how, grows, _to_stage(inputs, views, grows, say))


def on_every_node(nodes: list[dict[str, Any]], fn, **kwargs) -> dict[str, Any]:
    """``fn(**kwargs)`` run once on each of ``nodes`` (a task pinned to it, asking for no resources):
    {node description: its result, or None when it did not answer in time}."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not nodes:
        return {}
    remote = ray.remote(num_cpus=0, max_retries=0)(fn)
    refs = {
        _node_name(n): remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(**kwargs)
        for n in nodes
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
    return {name: ray.get(ref) if ref in ready else None for name, ref in refs.items()}


def _sees(marker: str | None, inputs: list[staging.Files]) -> dict[str, Any]:
    """On a node: the marker's text (None when it cannot read it), and whether it has each of ``inputs``."""
    try:
        text = Path(marker).read_text() if marker else None
    except OSError:
        text = None
    return {"marker": text, "inputs": [staging.present(f) for f in inputs]}


def _node_name(node: dict[str, Any]) -> str:
    return f"{node.get('NodeManagerAddress')} (node {node['NodeID'][:12]})"


def _check_storage(storage: str, views: dict[str, Any], token: str, grows: bool, say) -> None:
    """UserError when a node that runs trials cannot read the marker (``token``) the driver wrote to ``storage``."""
    blind = sorted(node for node, v in views.items() if not (v and v["marker"] == token))
    if blind:
        raise UserError(
            f"--storage {storage} is a local path that {len(blind)} of the {len(views)} node(s) that run trials "
            f"cannot see ({', '.join(blind)}): their trials could not save checkpoints there, nor the driver read "
            "them. Give --storage a URI every node can write, e.g. s3://BUCKET/vitplast (see docs/cluster.md), or "
            f"a shared filesystem mounted at {storage} on every node"
        )
    if grows:
        say(
            f"Storage {storage} is a local path every node sees now; nodes the autoscaler adds must see it too "
            "(a shared filesystem such as NFS), else use --storage s3://... or gs://..."
        )


def _to_stage(inputs: Sequence[staging.Files], views: dict[str, Any], grows: bool, say) -> list[staging.Files]:
    """The inputs to send to the nodes: those some node lacks, or every one when nodes may join later; UserError
    for one that is missing somewhere and too large to send."""
    out = []
    for i, files in enumerate(inputs):
        lacking = sorted(node for node, v in views.items() if not (v and v["inputs"][i]))
        if not lacking and not grows:
            continue
        if files.nbytes <= staging.LIMIT_BYTES:
            out.append(files)
        elif lacking:
            raise UserError(
                f"the {files.describe()} is not on node(s) {', '.join(lacking)} and is larger than the "
                f"{staging.LIMIT_BYTES / 2**30:g} GiB a search sends to the nodes through Ray's object store; put it "
                f"at {files.root} on every node (a shared filesystem, or the nodes' image), then search again"
            )
        else:
            say(f"The {files.describe()} is on every node now; nodes the autoscaler adds must have it at {files.root}.")
    return out
