"""Train a trial on several workers as a Ray Train run that its Tune trial launches and relays to Tune."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.log import get_logger
from vitplast_tune.plan.resources import TRIAL_PROCESS_CPU, TrialResources, ray_request

if TYPE_CHECKING:  # the driver of a search imports this without torch
    from vitplast_tune.data.decoded import InMemory

_log = get_logger(__name__)

PLACEMENTS = {"pack": "PACK", "spread": "SPREAD"}  # --placement: Ray's placement group strategies
WORKER_NODES = "worker_node_ids"  # the metric that names the node of each worker, rank 0 first
TRAIN_RUNS = "train_runs"  # the folder of a search (in its storage) where Train keeps its runs while they run


@dataclass(frozen=True)
class Workers:
    """Describe the workers of one trial: count, resources, placement, restarts, and where Train keeps checkpoints."""

    count: int = 1
    cpus: float = 1.0
    gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    placement: str = "pack"
    max_failures: int = 0
    storage: str = ""


def trial_workers(resources: TrialResources, *, max_failures: int, storage: str) -> Workers:
    """Return the ``Workers`` of each trial of a search."""
    share = resources.share
    return Workers(
        count=resources.workers,
        cpus=share.pop("cpu"),
        gpus=share.pop("gpu"),
        resources=share,
        placement=resources.placement,
        max_failures=max_failures,
        storage=storage,
    )


def trial_request(resources: TrialResources) -> dict[str, float]:
    """Return what one trial asks Tune for: its resources, or only its own process's with several workers."""
    if resources.workers == 1:
        return resources.request
    return {"cpu": TRIAL_PROCESS_CPU}


def concurrent_runs(resources: TrialResources, cluster: dict[str, float]) -> int | None:
    """Count how many trials of several workers a fixed cluster holds at once; None for one worker."""
    if resources.workers == 1:
        return None
    fits = [int(cluster.get(name, 0.0) // amount) for name, amount in ray_request(resources.request).items()]
    return max(1, min(fits)) if fits else None


Relay = Callable[[dict[str, Any], Any], None]


def train_on_workers(
    cfg: FinetuneConfig,
    workers: Workers,
    *,
    relay: Relay,
    resume: Any = None,
    decoded: InMemory | None = None,
) -> None:
    """Finetune ``cfg`` on ``workers`` as one Ray Train run, handing each report to ``relay``."""
    import ray.train
    from ray.util.queue import Empty, Queue

    from vitplast_tune import storage

    queue = Queue(maxsize=1, actor_options={"num_cpus": 0})
    name = f"train-{uuid.uuid4().hex[:12]}"
    trainer = _trainer(cfg, workers, name=name, resume=resume, decoded=decoded, queue=queue)
    outcome: dict[str, BaseException] = {}

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # raised below, in the trial's thread
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="train-run", daemon=True)
    thread.start()
    try:
        while thread.is_alive() or not queue.empty():
            try:
                metrics, checkpoint = queue.get(timeout=0.5)
            except Empty:
                continue
            relay(metrics, checkpoint)
        thread.join()
    finally:
        storage.remove(storage.join(workers.storage, name))  # Tune holds copies of what it reported
    if "error" in outcome:
        error = outcome["error"]
        if isinstance(error, ray.train.TrainingFailedError):
            raise WorkersFailed(failure_cause(error, workers)) from error
        raise error


def release_orphans() -> int:
    """Remove the placement groups of Train runs whose controller died, and return how many."""
    from ray.util.placement_group import remove_placement_group

    from vitplast_tune._compat import ray as ray_internals

    removed = 0
    for group in ray_internals.orphaned_train_placement_groups() or []:
        try:
            remove_placement_group(group)
        except Exception as exc:  # removed meanwhile (Train's own cleaner, where the State API answers)
            _log.debug(f"placement group {group.id.hex()} not removed: {exc}")
            continue
        removed += 1
    if removed:
        _log.debug(f"released {removed} placement group(s) of Train runs whose trial had ended")
    return removed


class ReleaseOrphans(Callback):
    """Release the placement groups of ended trials' Train runs every ``every_s`` seconds of Tune's loop.

    Args:
        every_s: The least time between two looks at the placement groups.
    """

    def __init__(self, every_s: float = 2.0):
        self.every_s, self._last = every_s, 0.0

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        """Release the orphaned placement groups when ``every_s`` has passed since the last look."""
        if time.monotonic() - self._last >= self.every_s:
            self._last = time.monotonic()
            release_orphans()


class WorkersFailed(RuntimeError):
    """Report that a worker of a trial's Train run died or raised more than ``--max-failures`` times."""


def failure_cause(error: BaseException, workers: Workers) -> str:
    """Describe a failed Train run in one line: each failed rank's error."""
    failures = getattr(error, "worker_failures", None) or {}
    parts = [f"rank {rank}: {_first_line(exc)}" for rank, exc in sorted(failures.items())] or [_first_line(error)]
    return f"the Train run of {workers.count} workers failed (max_failures {workers.max_failures} spent): " + "; ".join(
        parts
    )


def _first_line(error: BaseException) -> str:
    """Return an error's type and the first line of its message, cut at 160 characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:160]


def _trainer(cfg: FinetuneConfig, workers: Workers, *, name: str, resume, decoded, queue):
    """Build the ``TorchTrainer`` of a trial's Train run."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    resources = {"CPU": workers.cpus, **({"GPU": workers.gpus} if workers.gpus else {}), **workers.resources}
    scaling = ray.train.ScalingConfig(
        num_workers=workers.count,
        use_gpu=workers.gpus > 0,
        resources_per_worker=resources,
        placement_strategy=PLACEMENTS[workers.placement],
    )
    run_config = ray.train.RunConfig(
        name=name,
        storage_path=workers.storage,
        failure_config=ray.train.FailureConfig(max_failures=workers.max_failures),
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),  # the newest stays while Tune copies it
        callbacks=[_relay_callback(queue)],
    )
    config = {"cfg": cfg, "resume": resume, "decoded": decoded, "use_gpu": workers.gpus > 0}
    backend = TorchConfig(backend="nccl" if workers.gpus else "gloo")
    return TorchTrainer(
        _train_worker, train_loop_config=config, scaling_config=scaling, run_config=run_config, torch_config=backend
    )


def _relay_callback(queue):
    """Make a Train callback that puts each report on ``queue`` for the trial to take."""
    import ray.train

    class _Relay(ray.train.UserCallback):
        def after_report(self, run_context, metrics, checkpoint) -> None:
            queue.put((metrics[0], checkpoint))

    return _Relay()


def _train_worker(config: dict[str, Any]) -> None:
    """Finetune as one rank of a trial's Train run, reporting every evaluation and resuming after a restart."""
    import ray.train

    from vitplast_tune.run import checkpoints
    from vitplast_tune.vit import distributed, training

    context = ray.train.get_context()
    world = distributed.World(context.get_world_rank(), context.get_world_size())
    cfg: FinetuneConfig = config["cfg"]
    if cfg.threads:
        cfg = replace(cfg, threads=max(1, cfg.threads // world.size))
    device = _worker_device(config["use_gpu"])
    nodes = distributed.gather_strings(ray.get_runtime_context().get_node_id(), world)
    resume = checkpoints.read_checkpoint(ray.train.get_checkpoint() or config["resume"])

    def report(metrics: dict[str, Any], state: dict[str, Any]) -> None:
        metrics = {**metrics, "diverged": 0, "node_id": nodes[0], WORKER_NODES: ",".join(nodes)}
        if not world.main or not checkpoints.checkpoint_due(metrics, cfg.eval_every, cfg.checkpoint_every):
            ray.train.report(metrics if world.main else {}, checkpoint=None)
            return
        with checkpoints._checkpoint_directory(state) as directory:
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))

    try:
        training.finetune(cfg, report=report, resume=resume, device=device, decoded=config["decoded"], world=world)
    except training.DivergedError as exc:  # every worker at once: the loss is the run's; no retry
        ray.train.report(checkpoints.diverged(exc, cfg) if world.main else {}, checkpoint=None)


def _worker_device(use_gpu: bool):
    """Return this worker's torch device: the GPU Train gave it, else the CPU."""
    import torch

    if not use_gpu:
        return torch.device("cpu")
    import ray.train.torch

    device = ray.train.torch.get_device()
    torch.cuda.set_device(device)
    return device
