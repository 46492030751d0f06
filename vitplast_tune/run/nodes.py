"""Check what every node sees once Ray is up: a shared storage, and which of the driver's files to send."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitplast_tune.data import staging
from vitplast_tune.errors import UserError
from vitplast_tune.log import get_logger
from vitplast_tune.plan import resources
from vitplast_tune.plan.search_plan import SearchPlan
from vitplast_tune.run import cluster
from vitplast_tune.storage import is_uri

log = get_logger(__name__)

PROBE_TIMEOUT_S = 120.0


@dataclass
class Preflight:
    """Hold what the driver found once Ray is up: how a trial fits, whether nodes may join, what to send."""

    how: str
    grows: bool = False
    to_stage: list[staging.Files] = field(default_factory=list)


def _preflight(trial: dict[str, float], storage: str, inputs: Sequence[staging.Files] = ()) -> Preflight:
    """Check the trial request, that a local storage is shared, and which inputs the nodes need sent."""
    how = cluster.check_trial_fits(trial)
    if cluster.started_here():  # one machine: the driver's own disk
        return Preflight(how)
    grows = how != "node" or cluster.autoscales() is not False
    request = resources.ray_request(trial)
    nodes = [n for n in cluster.alive_nodes() if resources.fits(n.get("Resources", {}), request)]
    marker = None if is_uri(storage) else Path(storage) / f".vitplast-shared-{uuid.uuid4().hex}"
    try:
        if marker is not None:
            marker.write_text(marker.name)
        views = on_every_node(nodes, sees, marker=str(marker) if marker else None, inputs=list(inputs))
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)
    if marker is not None:
        check_storage(storage, views, marker.name, grows)
    return Preflight(how, grows, to_stage(inputs, views, grows))


def on_every_node(nodes: list[dict[str, Any]], fn, **kwargs) -> dict[str, Any]:
    """Run ``fn(**kwargs)`` once on each node; a node that does not answer in time gives None."""
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


def sees(marker: str | None, inputs: list[staging.Files]) -> dict[str, Any]:
    """Return, on a node, the marker's text and whether it has each of ``inputs``."""
    try:
        text = Path(marker).read_text() if marker else None
    except OSError:
        text = None
    return {"marker": text, "inputs": [staging.present(f) for f in inputs]}


def _node_name(node: dict[str, Any]) -> str:
    return f"{node.get('NodeManagerAddress')} (node {node['NodeID'][:12]})"


def check_storage(storage: str, views: dict[str, Any], token: str, grows: bool) -> None:
    """Refuse a local storage whose marker a node that runs trials cannot read."""
    blind = sorted(node for node, v in views.items() if not (v and v["marker"] == token))
    if blind:
        raise UserError(
            f"--storage {storage} is a local path that {len(blind)} of the {len(views)} node(s) that run trials "
            f"cannot see ({', '.join(blind)}): their trials could not save checkpoints there, nor the driver read "
            "them. Give --storage a URI every node can write, e.g. s3://BUCKET/vitplast (see docs/cluster.md), or "
            f"a shared filesystem mounted at {storage} on every node"
        )
    if grows:
        log.info(
            f"Storage {storage} is a local path every node sees now; nodes the autoscaler adds must see it too "
            "(a shared filesystem such as NFS), else use --storage s3://... or gs://..."
        )


def to_stage(inputs: Sequence[staging.Files], views: dict[str, Any], grows: bool) -> list[staging.Files]:
    """Return the inputs to send: those some node lacks, or all when nodes may join later."""
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
            log.info(
                f"The {files.describe()} is on every node now; nodes the autoscaler adds must have it at {files.root}."
            )
    return out


def stage_inputs(plan: SearchPlan) -> tuple[bool, list[staging.Staged]]:
    """Check the cluster for the plan, and return whether it can grow and the files sent to its nodes."""
    running = plan.running
    inputs = staging.needed(plan.settings, running.reference)
    checked = _preflight(running.resources.placement_request, plan.storage, inputs)  # several workers: one's
    for files in checked.to_stage:
        log.info(f"Sending the {files.describe()} to the nodes through Ray's object store")
    return checked.grows, staging.stage(checked.to_stage)
