"""A trial on several workers: one Ray Tune trial that trains data-parallel (``vit.distributed``).

A trial that asks for N workers (``--workers-per-trial``, by default one per GPU of ``--gpus-per-trial``) asks Ray
for a placement group of N bundles on one node (``STRICT_PACK``), each with 1/N of the trial's CPUs and GPUs. The
trial's own process, in bundle 0, is rank 0: it reads the checkpoint, reports, checkpoints and records exactly as a
one-worker trial does; ranks 1 to N-1 are Ray actors in the other bundles. Together they form one torch.distributed
process group on 127.0.0.1 (NCCL between GPUs, gloo between CPUs) and step alike on their shares of every batch.
This is the equivalent of Ray Train's TorchTrainer inside a Tune trial, without a second controller: Tune's own
reports, checkpoints and resume serve it unchanged.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from vitplast_tune.config import FinetuneConfig

if TYPE_CHECKING:  # the driver of a search imports this without torch
    from vitplast_tune.data.decoded import InMemory


def workers_per_trial(options: Any) -> int:
    """The data-parallel workers of one trial of a search's ``SearchOptions``: ``workers_per_trial`` when given, else
    one per whole GPU (one at most 1 GPU)."""
    if options.workers_per_trial:
        return options.workers_per_trial
    return int(options.gpus_per_trial) if options.gpus_per_trial > 1 else 1


def trial_request(options: Any):
    """What one trial asks Ray for: its resources, or for several workers a placement group of one bundle per worker
    on one node (bundle 0, the trial's own process, also holds any custom resources)."""
    workers = workers_per_trial(options)
    if workers == 1:
        return options.trial_resources
    from ray import tune

    share = {"CPU": options.cpus_per_trial / workers}
    if options.gpus_per_trial:
        share["GPU"] = options.gpus_per_trial / workers
    bundles = [{**share, **options.resources_per_trial}] + [dict(share) for _ in range(workers - 1)]
    return tune.PlacementGroupFactory(bundles, strategy="STRICT_PACK")


def trial_workers() -> int:
    """How many workers this trial has: the bundles of its placement group (1 outside one)."""
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    return len(group.bundle_specs) if group is not None else 1


def finetune(
    cfg: FinetuneConfig,
    *,
    report=None,
    resume: dict[str, Any] | None = None,
    decoded: InMemory | None = None,
):
    """``vit.training.finetune`` on this trial's workers: in this process alone, or as rank 0 of a process group whose
    other ranks run in Ray actors in the trial's placement group (each given the same settings, resume state and
    decoded dataset). Returns rank 0's result."""
    workers = trial_workers()
    if workers == 1:
        from vitplast_tune.vit import training

        return training.finetune(cfg, report=report, resume=resume, decoded=decoded)
    import ray

    from vitplast_tune.vit.rank import finetune_rank

    port = free_port()
    actors = start_ranks(workers)
    ray.get([actor.ready.remote() for actor in actors])  # started and importing: rank 0 waits for them below
    runs = [a.run.remote(cfg, rank, workers, port, resume, decoded) for rank, a in enumerate(actors, start=1)]
    try:
        result = finetune_rank(cfg, 0, workers, port, report=report, resume=resume, decoded=decoded)
        ray.get(runs)
        return result
    finally:
        for actor in actors:
            ray.kill(actor)


def start_ranks(workers: int) -> list:
    """Ranks 1 to ``workers - 1`` as Ray actors, one in each other bundle of this trial's placement group."""
    import ray
    from ray.util import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = get_current_placement_group()
    actors = []
    for index in range(1, workers):
        bundle = group.bundle_specs[index]
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        options = dict(num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0), scheduling_strategy=strategy)
        actors.append(ray.remote(_Rank).options(**options).remote())
    return actors


class _Rank:
    """A Ray actor that trains as one rank of a trial's data-parallel run."""

    def ready(self) -> bool:
        """True once the actor's process is up, with the training code imported."""
        import vitplast_tune.vit.rank  # noqa: F401

        return True

    def run(self, cfg: FinetuneConfig, rank: int, size: int, port: int, resume, decoded) -> None:
        """Finetune as rank ``rank`` (its metrics and model stay here: rank 0 reports them)."""
        from vitplast_tune.vit.rank import finetune_rank

        finetune_rank(cfg, rank, size, port, resume=resume, decoded=decoded)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (rank 0's process group listens there)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
