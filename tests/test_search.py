"""End to end: a real local Ray instance, real trials, a real MLflow SQLite store."""

import math

import pytest
from mlflow.tracking import MlflowClient

from vitplast_tune import results, search, tracking

pytestmark = pytest.mark.slow

SPACE = """
description: tiny end-to-end grid
metric: val_acc
mode: max
algorithm: grid
num_samples: 1
scheduler: fifo
parameters:
  components: {choice: [mha, fc1, ln1, ln2+fc2, all, head]}
  lr: {choice: [0.05]}
  optimizer: sgd
defaults: {model: vit_testbed_patch8_32, pretrained: false, max_steps: 24, eval_every: 8, warmup_steps: 4, batch_size: 32}
"""


@pytest.fixture(scope="module")
def finished(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    space = root / "tiny.yaml"
    space.write_text(SPACE)
    options = search.SearchOptions(
        space=str(space), name="tiny", storage=str(root / "results"), tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
        plasticity_pairs=64, verbose=0,
    )  # fmt: skip
    return search.run(options)


def test_every_trial_finishes_and_reports(finished):
    trials = finished.trials
    assert len(trials) == 6
    assert set(trials["components"]) == {"mha", "fc1", "ln1", "ln2+fc2", "all", "head"}
    assert (trials["step"] == 24).all() and trials["error"].isna().all()
    assert (trials["common_step"] == 24).all() and (trials["val_acc_common"] == trials["val_acc"]).all()
    assert trials["val_acc"].between(0, 1).all() and trials["test_acc"].between(0, 1).all()
    by_subset = trials.set_index("components")["trainable_params"]
    assert by_subset["head"] < by_subset["ln1"] < by_subset["mha"] < by_subset["all"]
    assert math.isnan(trials.set_index("components").loc["head", "plasticity_mean"])
    assert trials.set_index("components").loc["mha", "plasticity_mean"] > 0


def test_mlflow_parent_and_child_runs(finished):
    client = MlflowClient(finished.plan.tracking_uri)
    parent = client.get_run(finished.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags[tracking.SEARCH_TAG] == "tiny"
    assert parent.data.params["space"] == "tiny" and parent.data.params["algorithm"] == "grid"
    children = tracking.child_runs(client, finished.parent_run_id)
    assert len(children) == 6
    names = {r.info.run_name for r in children}
    assert any(name.startswith("ln2+fc2 lr=0.05") for name in names)
    for run in children:
        params, metrics = run.data.params, run.data.metrics
        assert run.info.status == "FINISHED"
        assert params["model"] == "vit_testbed_patch8_32" and params["dataset"] == "digits"
        assert params["optimizer"] == "sgd" and float(params["lr"]) == 0.05 and params["seed"] == "0"
        subset = params["components"]
        assert params["train_mha"] == str(subset in ("mha", "all"))
        assert 0 <= metrics["final_val_acc"] <= 1 and 0 <= metrics["test_acc"] <= 1
        history = client.get_metric_history(run.info.run_id, "val_acc")
        assert sorted(m.step for m in history) == [8, 16, 24]
        assert run.data.tags["ray.node_ip"]
        if subset != "head":
            assert metrics["plasticity_mean"] > 0 and metrics["plasticity_max"] >= metrics["plasticity_mean"]


def test_parent_run_has_plasticity_and_correlations(finished):
    client = MlflowClient(finished.plan.tracking_uri)
    parent = client.get_run(finished.parent_run_id)
    artifacts = {a.path for folder in ("plasticity", "analysis") for a in client.list_artifacts(finished.parent_run_id, folder)}
    assert {"plasticity/plasticity.csv", "plasticity/plasticity.png", "analysis/correlations.csv",
            "analysis/plasticity_mean_vs_val_acc.png", "analysis/log_trainable_params_vs_val_acc.png"} <= artifacts  # fmt: skip
    metrics = parent.data.metrics
    assert metrics["analysis/n_finished"] == 6
    assert metrics["corr/val_acc/plasticity_mean/n"] == 5  # the head-only trial has no plasticity score
    assert -1 <= metrics["corr/val_acc/plasticity_mean/spearman"] <= 1
    assert metrics["corr/val_acc/log_trainable_params/n"] == 6
    assert "corr/relative_gain/plasticity_mean/spearman" in metrics  # the grid has a linear probe
    assert metrics["plasticity/mha"] > 0
    assert metrics["corr/val_acc_common/log_trainable_params/n"] == 6  # every trial at the common step


def test_summary_names_results_and_mlflow_command(finished):
    text = results.summary(finished)
    assert "Top 6 trials" in text
    assert f"mlflow ui --backend-store-uri {finished.plan.tracking_uri}" in text
    assert "log_trainable_params" in text and "Spearman" in text


def test_pareto_fronts_printed_logged_and_throughput_on_child_runs(finished):
    trials = finished.trials
    assert (trials["images_per_s"] > 0).all() and not trials["over_budget"].any()
    text = results.summary(finished)
    assert text.index("Top 6 trials") < text.index("Pareto front, best validation accuracy vs fewer trainable parameters")
    assert "Pareto front, best validation accuracy vs more training images/s" in text
    client = MlflowClient(finished.plan.tracking_uri)
    artifacts = {a.path for a in client.list_artifacts(finished.parent_run_id, "pareto")}
    assert {"pareto/pareto_trainable_params.csv", "pareto/pareto_trainable_params.png", "pareto/pareto_images_per_s.png"} <= artifacts
    assert results.pareto_front(trials, "trainable_params")["components"].iloc[0] == "head"  # the cheapest trial
    for run in tracking.child_runs(client, finished.parent_run_id):
        assert run.data.metrics["images_per_s"] > 0
