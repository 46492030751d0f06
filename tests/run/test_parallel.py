"""A trial on two workers (two gloo ranks on the CPU) against the same trial on one, at the same batch: the same loss
curve (relative difference below 1e-4: only the order of float sums differs), accuracies, reports, checkpoints,
MLflow records and best model; and a two-worker run resumed from its checkpoint ends as the uninterrupted one."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from _spaces import space_text
from mlflow.tracking import MlflowClient

from vitplast_tune import run_search
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import UserError
from vitplast_tune.plan import SearchOptions
from vitplast_tune.plan.checks import check_resources as _check_resources
from vitplast_tune.records.tracking import WORKERS_TAG, child_runs
from vitplast_tune.run.parallel import finetune, trial_request

pytestmark = pytest.mark.slow

RTOL = 1e-4  # the tolerance on the loss curves: the ranks' gradient mean sums floats in another order
SETTINGS = dict(augment="none", precision="fp32", max_steps=8, eval_every=4, batch_size=16, warmup_steps=2)
SPACE = space_text(description="two workers against one", defaults=SETTINGS)


def search(root, name: str, workers: int):
    space = root / "space.yaml"
    space.write_text(SPACE)
    options = SearchOptions(
        space=str(space),
        name=name,
        storage=str(root / "results"),
        tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
        cpus_per_trial=1,  # two workers: half a CPU each, in one placement group on this node
        workers_per_trial=workers,
        plasticity=False,
        verbose=0,
    )
    return run_search(options)


@pytest.fixture(scope="module")
def both(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    return search(root, "one", 1), search(root, "two", 2)


def history(result, metric: str) -> list[float]:
    client = MlflowClient(result.place.tracking_uri)
    (child,) = child_runs(client, result.parent_run_id)
    return [m.value for m in sorted(client.get_metric_history(child.info.run_id, metric), key=lambda m: m.step)]


def test_two_workers_follow_the_loss_curve_of_one_at_the_same_batch(both):
    one, two = both
    assert len(one.trials) == len(two.trials) == 1 and two.trials["error"].isna().all()
    client = MlflowClient(one.place.tracking_uri)
    workers = [child_runs(client, r.parent_run_id)[0].data.tags[WORKERS_TAG] for r in both]
    assert workers == ["1", "2"]  # the two-worker trial did train on two
    losses_one, losses_two = history(one, "train_loss"), history(two, "train_loss")
    assert len(losses_one) == len(losses_two) == 2  # every evaluation, recorded in MLflow for both
    assert losses_two == pytest.approx(losses_one, rel=RTOL)
    assert history(two, "val_loss") == pytest.approx(history(one, "val_loss"), rel=RTOL)
    for metric in ("val_acc", "best_val_acc", "test_acc", "step", "trainable_params"):
        assert two.trials[metric].iloc[0] == pytest.approx(one.trials[metric].iloc[0], rel=RTOL), metric


def test_two_workers_report_checkpoint_and_record_as_one(both):
    one, two = both
    client = MlflowClient(one.place.tracking_uri)
    (run_one,) = child_runs(client, one.parent_run_id)
    (run_two,) = child_runs(client, two.parent_run_id)
    assert set(run_two.data.metrics) == set(run_one.data.metrics)
    assert {k: v for k, v in run_two.data.params.items()} == {k: v for k, v in run_one.data.params.items()}
    assert run_two.info.status == run_one.info.status == "FINISHED"
    checkpoints = [sorted(p.parent.name for p in Path(r.place.local_dir).rglob("state.pt")) for r in both]
    assert checkpoints[0] == checkpoints[1] and len(checkpoints[0]) == 2  # both evaluations, in the search's storage
    assert all(len(list(Path(r.place.local_dir).rglob("best.safetensors"))) == 2 for r in both)
    from vitplast_tune.vit import best_model

    model_one = best_model.load_best_model("one", one.place.storage)
    model_two = best_model.load_best_model("two", two.place.storage)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model_two(x), model_one(x), rtol=1e-3, atol=1e-4)


def test_a_two_worker_run_resumed_from_its_checkpoint_ends_as_the_uninterrupted_one(ray_local):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cfg = FinetuneConfig(model="vit_testbed_patch8_32", pretrained=False, components="fc1", threads=1, **SETTINGS)
    group = placement_group([{"CPU": 0.5}, {"CPU": 0.5}], strategy="STRICT_PACK")
    ray.get(group.ready())
    strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
    try:
        whole, first = ray.get(_two_workers.options(num_cpus=0.5, scheduling_strategy=strategy).remote(cfg, None))
        resumed, _ = ray.get(_two_workers.options(num_cpus=0.5, scheduling_strategy=strategy).remote(cfg, first))
    finally:
        remove_placement_group(group)
    assert first["step"] == 4 and resumed["step"] == whole["step"] == 8
    assert resumed["train_loss"] == pytest.approx(whole["train_loss"], rel=RTOL)
    assert resumed["val_acc"] == whole["val_acc"]


def _remote(fn):
    import ray

    return ray.remote(fn)


@_remote
def _two_workers(cfg, resume):
    """In bundle 0 of a two-bundle group, as a trial runs: ``finetune``; (final metrics, the first state
    reported, as a checkpoint would hold it)."""
    states = []
    result = finetune(cfg, resume=resume, report=lambda m, s: states.append(copy.deepcopy(s)))
    return result.metrics, states[0]


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


def test_a_trial_of_several_workers_asks_for_one_bundle_each_on_one_node():
    request = trial_request(SearchOptions(cpus_per_trial=8, gpus_per_trial=2, resources_per_trial={"a": 1}))
    assert request.bundles == [{"CPU": 4.0, "GPU": 1.0, "a": 1}, {"CPU": 4.0, "GPU": 1.0}]
    assert request.strategy == "STRICT_PACK"
    assert trial_request(SearchOptions(gpus_per_trial=1)) == {"cpu": 1.0, "gpu": 1.0}
    _check_resources(SearchOptions(gpus_per_trial=2))  # two GPUs: two workers
