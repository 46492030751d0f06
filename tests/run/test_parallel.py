"""A trial on two workers (a Ray Train run of two gloo ranks on the CPU, the model in DDP): a two-worker run resumed
from its checkpoint ends as the uninterrupted one; the workers' requests, the dry run's words and a failed run's
one-line cause. Against one worker (the same loss curve within 1e-6 at every evaluation, reports, checkpoints, MLflow
records and best model), as a user runs it on two nodes: tests/run/test_cluster.py."""

from __future__ import annotations

import pytest

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import UserError
from vitplast_tune.plan import SearchOptions
from vitplast_tune.plan.checks import check_resources as _check_resources
from vitplast_tune.plan.resources import TrialResources
from vitplast_tune.run.parallel import Workers, concurrent_runs, train_on_workers, trial_request, trial_workers

ATOL = 1e-6  # the loss curves, at every evaluation (fp32): DDP sums the ranks' gradients in another order
SETTINGS = dict(augment="none", precision="fp32", max_steps=8, eval_every=4, batch_size=16, warmup_steps=2)


@pytest.mark.slow
def test_a_two_worker_run_resumed_from_its_checkpoint_ends_as_the_uninterrupted_one(ray_local, tmp_path):
    import ray.train

    cfg = FinetuneConfig(model="vit_testbed_patch8_32", pretrained=False, components="fc1", threads=1, **SETTINGS)
    workers = Workers(count=2, cpus=0.5, storage=str(tmp_path / "train"))
    whole, first = [], tmp_path / "first"

    def keep(metrics, checkpoint):
        whole.append(metrics)
        if checkpoint is not None and not first.exists():
            checkpoint.to_directory(str(first))  # as Tune copies it into the trial's folder

    train_on_workers(cfg, workers, relay=keep)
    resumed = []
    resume = ray.train.Checkpoint.from_directory(str(first))
    train_on_workers(cfg, workers, relay=lambda m, c: resumed.append(m), resume=resume)
    assert [m["step"] for m in whole] == [4, 8] and [m["step"] for m in resumed] == [8]
    assert resumed[-1]["train_loss"] == pytest.approx(whole[-1]["train_loss"], rel=0, abs=ATOL)
    assert resumed[-1]["val_acc"] == whole[-1]["val_acc"]
    assert whole[-1]["workers"] == 2 and len(whole[-1]["worker_node_ids"].split(",")) == 2
    assert list((tmp_path / "train").iterdir()) == []  # Train's runs are gone: Tune keeps what was reported


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(gpus_per_trial=2.5), "each data-parallel worker trains on one GPU"),
        (dict(gpus_per_trial=4, workers_per_trial=2), "each data-parallel worker trains on one GPU"),
        (dict(gpus_per_trial=1, workers_per_trial=2), "needs a whole GPU each"),
        (dict(workers_per_trial=-1), "must not be negative"),
    ],
)
def test_worker_counts_that_cannot_each_have_a_gpu_are_refused(options, message):
    with pytest.raises(UserError, match=message):
        _check_resources(SearchOptions(**options))


def test_a_trial_of_several_workers_asks_train_for_one_share_each():
    options = SearchOptions(cpus_per_trial=8, gpus_per_trial=2, resources_per_trial={"a": 1}, placement="spread")
    resources = TrialResources.of(options)
    assert trial_request(resources) == {"cpu": 0.01}  # the trial's own process; its Train run asks for the workers
    workers = trial_workers(resources, max_failures=3, storage="/s")
    assert workers == Workers(
        count=2, cpus=3.995, gpus=1.0, resources={"a": 0.5}, placement="spread", max_failures=3, storage="/s"
    )
    assert concurrent_runs(resources, {"CPU": 16, "GPU": 6, "a": 5}) == 2  # the CPUs hold two such trials at once
    one = TrialResources.of(SearchOptions(gpus_per_trial=1))
    assert concurrent_runs(one, {"CPU": 16, "GPU": 6}) is None  # Tune counts one worker
    assert trial_request(one) == {"cpu": 1.0, "gpu": 1.0}
    _check_resources(SearchOptions(gpus_per_trial=2))  # two GPUs: two workers
    with pytest.raises(UserError, match="--placement must be pack or spread"):
        _check_resources(SearchOptions(placement="scatter"))


def test_the_dry_run_says_each_trials_workers_their_resources_and_placement():
    from types import SimpleNamespace

    from vitplast_tune.plan import estimate
    from vitplast_tune.plan.search_plan import Running

    options = SearchOptions(cpus_per_trial=4, gpus_per_trial=2, placement="spread")
    plan = SimpleNamespace(running=Running.of(options), max_concurrent=None, spec=SimpleNamespace(total_trials=8))
    nodes = [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 2.0}]
    lines = estimate.describe_resources(plan, "the cluster", nodes, 2)
    assert lines[0].startswith("resources:  {CPU: 4, GPU: 2} per trial")
    assert lines[1] == (
        "workers:    2 per trial, a Ray Train run of torch DDP (NCCL), each {CPU: 1.995, GPU: 1}, placement spread "
        "(over different nodes where it can); the trial's own process {CPU: 0.01}"
    )
    # a trial's workers may span nodes: the two small nodes hold one trial between them, the large one another
    assert estimate.concurrency(plan, nodes, "the cluster") == 2
    one = SimpleNamespace(running=Running.of(SearchOptions(cpus_per_trial=4)), max_concurrent=None, spec=plan.spec)
    assert not any(line.startswith("workers:") for line in estimate.describe_resources(one, "here", nodes, 1))


def test_a_failed_train_run_is_one_line_naming_each_failed_ranks_error():
    from ray.train import WorkerGroupError

    from vitplast_tune.records.table import error_line
    from vitplast_tune.run.parallel import failure_cause

    workers = Workers(count=2, max_failures=1)
    died = RuntimeError("A worker health check failed.\nThe actor died unexpectedly before finishing this task.")
    error = WorkerGroupError("snippets", {1: ConnectionError("Read error: reset by peer\nmore"), 0: died})
    assert failure_cause(error, workers) == (
        "the Train run of 2 workers failed (max_failures 1 spent): rank 0: RuntimeError: A worker health check "
        "failed.; rank 1: ConnectionError: Read error: reset by peer"
    )
    assert failure_cause(ValueError("the controller\nfailed"), workers).endswith(": ValueError: the controller")
    # A trial's error reaches the trial table and its MLflow run as Ray's: the traceback first, the error last.
    assert (
        error_line("ray::ImplicitFunc.train()\n  File x\n\nWorkersFailed: the cause \n\n") == "WorkersFailed: the cause"
    )
    assert error_line("") == "error"
