"""The jobs built from a search and the rooms below it, one verb each: a dry run (the plan, timed here, nothing
started), analyzing a finished search again, the paper's cross-dataset table of several, and checking a
recommendation with a short search. The only module above both ``run`` and ``recommend``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path

from vitplast_tune import child
from vitplast_tune._compat import mlflow as mlflow_internals
from vitplast_tune.analysis import protocol
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.plan import estimate, resources
from vitplast_tune.plan.options import EXPERIMENT, SearchOptions
from vitplast_tune.plan.planner import prepare
from vitplast_tune.recommend import verify
from vitplast_tune.recommend.ranking import Recommendation
from vitplast_tune.records import tracking, trials
from vitplast_tune.records.result import SearchResult
from vitplast_tune.space.files import load_space
from vitplast_tune.storage import SearchPlace, default_storage, read_record


def dry_run(options: SearchOptions) -> str:
    """Validate ``options`` exactly as a search does (``plan.prepare``), time a few steps here, and describe the plan
    and its estimated wall time (``plan.estimate``); start nothing."""
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
    """(where, each node's Ray resources): the cluster's nodes when joining one (``--address`` or ``RAY_ADDRESS``),
    else this machine as a local Ray instance would see it, without starting one."""
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


def reanalyze(
    name: str, storage: str | None = None, tracking_uri: str | None = None, criteria: bool = False
) -> SearchResult:
    """Analyze a finished search again from its stored trial table and log to its parent run (``criteria``: also the lab)."""
    directory = Path(storage or default_storage()).expanduser() / name
    record, table = read_record(directory, purpose="recorded"), trials.read_trials(directory)
    spec = load_space(record["space_path"])
    spec = dataclasses.replace(spec, criteria=spec.criteria or criteria)
    uri = tracking_uri or record["tracking_uri"]
    place = SearchPlace(
        name, str(directory.parent), uri, record.get("experiment", EXPERIMENT), record.get("search_id", "")
    )
    result = SearchResult(place, spec, FinetuneConfig.from_dict(record["settings"]), table, record["parent_run_id"])
    from vitplast_tune.run import driver  # Ray Tune: imported by the jobs that run or record a search

    with mlflow_internals.no_artifact_progress_bar():
        driver.analyze(result, tracking.client(uri))
    return result


def compare_datasets(names: Sequence[str], storage: str | None = None, out_dir: str | None = None) -> str:
    """The paper's cross-dataset table of several finished searches (one per dataset), written to ``out_dir``; as text."""
    root = Path(storage or default_storage()).expanduser()
    found = {name: trials.read_trials(root / name) for name in names}
    out = Path(out_dir).expanduser() if out_dir else root / f"cross-{'-'.join(names)}"
    gains, agreement, _ = protocol.cross_dataset_report(found, out)
    return protocol.describe_cross_dataset(gains, agreement) + f"\nfiles: {out}"


def verify_recommendation(
    rec: Recommendation,
    k: int,
    storage: Path,
    *,
    name: str | None = None,
    lrs=verify.VERIFY_LRS,
    max_steps: int | None = None,
    cpus_per_trial: float = 1.0,
    verbose: int = 0,
):
    """Check a recommendation with a short search: the grid of ``recommend.verify.verify_space`` run under ``storage``;
    return ``verification``'s table and the search's ``SearchResult``."""
    name = name or f"recommend-verify-{time.strftime('%Y%m%d-%H%M%S')}"
    space = verify.verify_space(rec, k, Path(storage).expanduser() / "recommend", lrs=lrs, max_steps=max_steps)
    options = SearchOptions(
        space=str(space),
        name=name,
        storage=str(storage),
        cpus_per_trial=cpus_per_trial,
        verbose=verbose,
        settings={"seed": rec.settings.seed},
    )
    from vitplast_tune.run import driver

    result = driver.run(options)
    return verify.verification(rec, result.trials, k), result
