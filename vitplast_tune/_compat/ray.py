"""Ray core internals (read from Ray 2.60.0): this process's own node, the resources a local instance would have,
the autoscaler's status report and cluster config in the GCS, whether this code runs in a Ray worker, and the
placement groups that Ray Train runs left behind.

Each returns None (or False) when Ray moved it, so a caller falls back to what public APIs tell.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def local_resources() -> dict[str, float] | None:
    """The resources a local Ray instance would have on this machine (CPUs, GPUs, accelerators, with
    RAY_OVERRIDE_RESOURCES), known before it starts: ``ray._private.resource_and_label_spec.ResourceAndLabelSpec``."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        spec = ResourceAndLabelSpec().resolve(is_head=True)
    except Exception:
        return None
    found = {"CPU": float(spec.num_cpus or 0), "GPU": float(spec.num_gpus or 0)}
    return {**found, **{k: float(v) for k, v in (spec.resources or {}).items()}}


def started_here() -> bool:
    """Whether this process started the Ray instance it uses (its ``_global_node`` is a head node)."""
    try:
        import ray._private.worker

        node = ray._private.worker._global_node
        return node is not None and node.is_head()
    except Exception:
        return False


def in_worker() -> bool:
    """Whether this code runs in a Ray task or actor (``global_worker.mode`` is WORKER_MODE), without importing Ray."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    try:
        return ray._private.worker.global_worker.mode == ray.WORKER_MODE
    except AttributeError:
        return False


def autoscaler_node_types() -> dict[str, str] | None:
    """The autoscaler's last report's node-type mapping (node id -> type name) from the GCS's internal KV
    (``ray_constants.DEBUG_AUTOSCALING_STATUS``); None when there is no report."""
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
    """{node group: resources} of the cluster config autoscaler v2 keeps in the GCS (KubeRay's default), groups that
    may not grow left out; None when there is none (``ray._private.state.state.get_cluster_config``)."""
    try:
        import ray._private.state

        config = ray._private.state.state.get_cluster_config()
    except Exception:
        return None
    if config is None or not config.node_group_configs:
        return None
    return {g.name: dict(g.resources) for g in config.node_group_configs if g.max_count != 0}


def orphaned_train_placement_groups() -> list[Any] | None:
    """The placement groups of Ray Train runs whose controller died (its trial stopped by a scheduler, or killed).

    Ray keeps a placement group until both the actor and the job that made it have ended, so the workers' group of
    a Train run whose controller died holds its CPUs and GPUs while the search runs; Train's own
    ``PlacementGroupCleaner`` asks the State API for the controller, which a local instance without a dashboard (or a
    machine with several Ray instances) does not answer. Read from the GCS's placement group table
    (``gcs_pb2.PlacementGroupTableData``: ``creator_actor_id``, ``creator_actor_dead``, ``is_detached``) and the
    actor table (the creator's class, ``TrainController``). None when Ray moved them.
    """
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
