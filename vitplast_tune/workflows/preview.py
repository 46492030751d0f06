"""The dry run: a search's plan validated as the search would, a few steps timed here, its estimated wall time
described; nothing started."""

from __future__ import annotations

import os
import time

from vitplast_tune import child
from vitplast_tune.plan import estimate, resources
from vitplast_tune.plan.options import SearchOptions
from vitplast_tune.plan.planner import prepare


def dry_run(options: SearchOptions) -> str:
    """Validate a search's options as the search would, time a few steps here, and describe the plan; start nothing.

    Args:
        options: The search's options, checked as a search checks them (``plan.prepare``).

    Returns:
        The plan's description: its trials, the resources, and the estimated wall time (``plan.estimate``).

    Raises:
        UserError: If the options, the space or the settings are invalid.
    """
    started = time.perf_counter()
    with child.session():  # the checks and the timed steps in one child process: torch imported once
        plan = prepare(options)
        configs = estimate.timed_configs(plan)
        device = "cuda" if options.gpus_per_trial > 0 else "cpu"  # a trial without GPUs sees none (Ray hides them)
        steps, budget_s = estimate.STEPS, estimate.BUDGET_S
        timed = child.call_in_child(
            "vitplast_tune.vit.training:time_steps", configs, device, steps, budget_s, plan.decoded
        )
    timings = [estimate.Timing(**{k: run[k] for k in estimate.Timing.__dataclass_fields__}) for run in timed["runs"]]
    where, nodes = capacity(options.address, timed["gpus"])
    at_once = estimate.concurrency(plan, nodes, where)
    lines = [f"Dry run of search {plan.name!r}: validated, nothing started (no Ray, no MLflow run).", ""]
    lines += estimate.describe_trials(plan)
    lines += estimate.describe_resources(plan, where, nodes, at_once)
    lines += estimate.describe_estimate(plan, timings, timed["device"], at_once)
    lines += ["", f"results: {plan.storage}/{plan.name}   MLflow: {plan.tracking_uri}"]
    lines += [f"(this dry run took {time.perf_counter() - started:.1f} s; without --dry-run the search starts)"]
    return "\n".join(lines)


def capacity(address: str | None, local_gpus: int) -> tuple[str, list[dict[str, float]]]:
    """Find the Ray resources a search would have, without starting a local Ray instance.

    Args:
        address: The cluster to join (None: ``RAY_ADDRESS``, else none: this machine).
        local_gpus: The GPUs this machine has, for a local instance.

    Returns:
        Where the search would run, in words, and each node's Ray resources: the cluster's nodes when joining one,
        else this machine as a local Ray instance would see it.
    """
    joining = resources.address(address)
    if not joining:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return "this machine", [{"CPU": float(cpus), "GPU": float(local_gpus)}]
    import ray

    from vitplast_tune.run import cluster

    cluster.connect(joining, log_to_driver=False, configure_logging=False)
    try:
        nodes = [resources.plain_resources(n.get("Resources", {})) for n in cluster.alive_nodes()]
        return f"the cluster at {joining}", nodes
    finally:
        ray.shutdown()
