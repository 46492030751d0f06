"""Measure a search's predictors before its trials in one Ray worker with a trial's resources, or in this process."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from vitplast_tune.data import staging
from vitplast_tune.log import get_logger
from vitplast_tune.plan import resources
from vitplast_tune.plan.search_plan import SearchPlan
from vitplast_tune.predictors.report import Predictors, describe_gradients, gradient_report, search_report
from vitplast_tune.storage import spoken
from vitplast_tune.timings import Timings

log = get_logger(__name__)


def worker_options(trial: dict[str, float]) -> dict[str, Any]:
    """Return the measuring worker's ``ray.remote`` options: a trial's resources, a whole GPU if it uses any."""
    request = resources.ray_request(trial)
    cpus, gpus = request.pop("CPU", 0.0), request.pop("GPU", 0.0)
    return {"num_cpus": cpus, "num_gpus": 1 if gpus else 0, "resources": request, "max_restarts": 0}


class _Worker:
    """Run the functions the driver sends, in the measuring worker."""

    def call(self, fn, kwargs):
        return fn(**kwargs)


def measures_here(trial: dict[str, float]) -> bool:
    """Say whether this process measures for itself: it holds torch already, and a trial asks for CPUs only."""
    return "torch" in sys.modules and set(resources.ray_request(trial)) <= {"CPU", "memory"}


@contextlib.contextmanager
def measuring_worker(
    trial: dict[str, float],
    every_s: float = 30.0,
    doing: str = "measuring",
    while_waiting: Callable[[], Any] | None = None,
    here: bool | None = None,
) -> Iterator[Callable[..., Any]]:
    """Give a runner backed by one Ray worker with a trial's resources, started at the first call.

    A process that holds torch already (a notebook, a script that imported it) and trials that ask for CPUs only
    measure in this process: a worker would only import torch again.

    Args:
        trial: The resources as ``--*-per-trial`` give them.
        every_s: Seconds between the lines saying a call still runs.
        doing: What those lines say it does.
        while_waiting: What to call every second while a call runs (None: nothing).
        here: Whether to run the calls in this process (None: as ``measures_here`` says).

    Yields:
        The runner: ``runner(fn, **kwargs)`` returns ``fn(**kwargs)``.
    """
    if measures_here(trial) if here is None else here:
        yield lambda fn, **kwargs: fn(**kwargs)
        return
    import ray

    shown = resources.show_resources(resources.ray_request(trial))
    workers: list[Any] = []

    def run(fn, **kwargs):
        if not workers:
            workers.append(ray.remote(**worker_options(trial))(_Worker).remote())
        ref = workers[0].call.remote(fn, kwargs)
        started = said = time.monotonic()
        while not ray.wait([ref], timeout=1.0 if while_waiting else every_s)[0]:
            if while_waiting is not None:
                while_waiting()
            if time.monotonic() - said >= every_s or while_waiting is None:
                said = time.monotonic()
                log.info(f"  ... still {doing} ({said - started:.0f} s, a Ray worker with {shown})")
        return ray.get(ref)

    try:
        yield run
    finally:
        for worker in workers:
            ray.kill(worker, no_restart=True)


def measure_predictors(
    plan: SearchPlan, staged: Sequence[staging.Staged] = (), timings: Timings | None = None
) -> Predictors:
    """Measure the plasticity and the gradient table a search needs, in one Ray worker.

    Args:
        plan: The search's plan.
        staged: The files the driver staged for the trials.
        timings: Where their seconds are added.

    Returns:
        The predictors; none when the plan measures no plasticity.
    """
    if not plan.running.plasticity:
        return Predictors()
    timings = timings or Timings()
    s, o = plan.settings, plan.running
    with measuring_worker(o.resources.request) as run:  # one worker, one import of torch, for both
        log.info(
            f"Plasticity of {s.model} ({o.plasticity_variant} variant): {s.dataset} test split vs {o.plasticity_reference} ..."
        )
        with timings.phase("plasticity"):
            measured = search_report(
                s,
                reference=o.plasticity_reference,
                variant=o.plasticity_variant,
                max_pairs=o.plasticity_pairs,
                runner=run,
                decoded=plan.decoded,
                staged=list(staged),
            )
        ranked = measured.ranking.dropna(subset=["rank"]).sort_values("rank")
        order = " > ".join(f"{r.component} {r.plasticity:.3g}" for r in ranked.itertuples())
        log.info(
            f"  ranking: {order}  ({'cached' if measured.meta.get('reused') else 'measured'}, {spoken(measured.out_dir)})"
        )
        with timings.phase("gradients"):
            gradients = gradient_report(s, decoded=plan.decoded, runner=run, staged=list(staged))
        log.info(
            f"Gradient criteria of {s.model} on {gradients.attrs.get('num_batches')} unaugmented training batches, "
            f"mean ± std over {gradients['head_seed'].nunique()} head initialisations:\n"
            + describe_gradients(gradients)
        )
    return Predictors(measured, gradients)
