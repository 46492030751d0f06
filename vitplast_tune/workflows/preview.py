"""Validate a search's plan, time a few steps here and estimate its wall time, starting nothing."""

from __future__ import annotations

import os
import time

from vitplast_tune import subprocess_call
from vitplast_tune.plan import estimate, resources
from vitplast_tune.plan.options import SearchOptions
from vitplast_tune.plan.planner import prepare
from vitplast_tune.plan.search_plan import SearchPlan


def dry_run(options: SearchOptions) -> str:
    """Validate a search's options as the search would, time a few steps here and describe the plan, starting nothing.

    Args:
        options: The search's options.

    Returns:
        The plan's description with its trials, resources and estimated wall time.

    Raises:
        UserError: If the options, the space or the settings are invalid.
    """
    started = time.perf_counter()
    with subprocess_call.session():  # one child process runs the checks and the timed steps, so torch is imported once
        plan = prepare(options)
        device = "cuda" if options.gpus_per_trial > 0 else "cpu"  # Ray hides the GPUs from a trial without any
        timings, timed_on, gpus = _time_steps(plan, device)
    where, nodes = _capacity(options.address, gpus)
    at_once = estimate.concurrency(plan, nodes, where)
    lines = [f"Dry run of search {plan.name!r}: validated, nothing started (no Ray, no MLflow run).", ""]
    lines += estimate.describe_trials(plan)
    lines += estimate.describe_resources(plan, where, nodes, at_once)
    lines += estimate.describe_estimate(plan, timings, timed_on, at_once)
    lines += ["", f"results: {plan.storage}/{plan.name}   MLflow: {plan.tracking_uri}"]
    lines += [f"(this dry run took {time.perf_counter() - started:.1f} s; without --dry-run the search starts)"]
    return "\n".join(lines)


def _time_steps(plan: SearchPlan, device: str) -> tuple[list[estimate.Timing], str, int]:
    """Time a few steps of each timed configuration in a child process and return the timings, device and GPUs."""
    timed = subprocess_call.call_in_child(
        "vitplast_tune.vit.training:time_steps",
        estimate.timed_configs(plan),
        device,
        estimate.STEPS,
        estimate.BUDGET_S,
        plan.decoded,
    )
    timings = [estimate.Timing(**{k: run[k] for k in estimate.Timing.__dataclass_fields__}) for run in timed["runs"]]
    return timings, timed["device"], timed["gpus"]


def _capacity(address: str | None, local_gpus: int) -> tuple[str, list[dict[str, float]]]:
    """Find where a search would run and each node's Ray resources, without starting a local Ray instance."""
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
