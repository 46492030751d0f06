"""Read Ray core internals (from Ray 2.60.0); each returns None or False when Ray moved it."""

from __future__ import annotations

import json
import sys
from typing import Any


def local_resources() -> dict[str, float] | None:
    """Return the resources a local Ray instance would have on this machine, before it starts."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        spec = ResourceAndLabelSpec().resolve(is_head=True)
    except Exception:
        return None
    found = {"CPU": float(spec.num_cpus or 0), "GPU": float(spec.num_gpus or 0)}
    return {**found, **{k: float(v) for k, v in (spec.resources or {}).items()}}


def started_here() -> bool:
    """Tell whether this process started the Ray instance it uses."""
    try:
        import ray._private.worker

        node = ray._private.worker._global_node
        return node is not None and node.is_head()
    except Exception:
        return False


def in_worker() -> bool:
    """Tell whether this code runs in a Ray task or actor, without importing Ray."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    try:
        return ray._private.worker.global_worker.mode == ray.WORKER_MODE
    except AttributeError:
        return False


def autoscaler_node_types() -> dict[str, str] | None:
    """Return the node-type mapping of the autoscaler's last report, or None."""
    try:
        from ray._private import ray_constants
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    except Exception:
        return None
    if not raw:
        return None
    return (json.loads(raw).get("autoscaler_report") or {}).get("node_type_mapping") or None


def cluster_node_groups() -> dict[str, dict[str, float]] | None:
    """Return the resources of each node group that may grow in autoscaler v2's cluster config, or None."""
    try:
        import ray._private.state

        config = ray._private.state.state.get_cluster_config()
    except Exception:
        return None
    if config is None or not config.node_group_configs:
        return None
    return {g.name: dict(g.resources) for g in config.node_group_configs if g.max_count != 0}


def orphaned_train_placement_groups() -> list[Any] | None:
    """List the placement groups of Ray Train runs whose controller died, or None."""
    try:
        import ray
        from ray._private.state import actors, state
        from ray.core.generated import gcs_pb2
        from ray.util.placement_group import PlacementGroup

        table = state._connect_and_get_accessor().get_placement_group_table()
        live = (gcs_pb2.PlacementGroupTableData.PENDING, gcs_pb2.PlacementGroupTableData.CREATED)
        found = []
        for raw in table:
            group = gcs_pb2.PlacementGroupTableData.FromString(raw)
            creator = group.creator_actor_id
            if group.state not in live or group.is_detached or not group.creator_actor_dead:
                continue
            if not creator or creator == b"\xff" * len(creator):  # made by a driver (Tune's trials): not an actor
                continue
            if actors(actor_id=creator.hex()).get("ActorClassName") == "TrainController":
                found.append(PlacementGroup(ray.PlacementGroupID(group.placement_group_id)))
        return found
    except Exception:
        return None
