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


def test_measurements_run_as_ray_tasks_with_a_trials_resources(ray_local):
    from vitplast_tune import cluster, report

    assert cluster.task_options({"cpu": 2, "gpu": 0.25, "a100": 1}) == {
        "num_cpus": 2.0, "num_gpus": 1, "resources": {"a100": 1.0}, "max_retries": 0}  # fmt: skip
    where = cluster.task_runner({"cpu": 0.5, "gpu": 0})(report.task_context)
    assert where["resources"] == {"CPU": 0.5}
    assert where["node_id"] in {n["NodeID"] for n in ray_local.nodes()}


def test_the_search_measured_its_predictors_in_a_ray_task(finished):
    client = MlflowClient(finished.plan.tracking_uri)
    paths = {a.path for a in client.list_artifacts(finished.parent_run_id, "criteria")}
    assert paths == {"criteria/gradients.csv"}
    assert {"grad_norm", "rgn", "rgn_mean"} <= set(finished.trials.columns)
    assert (finished.trials.loc[finished.trials["components"] != "head", "rgn"] > 0).all()


LAB_SPACE = """
description: tiny criteria lab
metric: val_acc
mode: max
algorithm: grid
num_samples: 1
scheduler: fifo
criteria: true
parameters:
  components: {choice: [mha, fc1, ln1, ln2+fc2, mha+fc1, head]}
  lr: {choice: [0.05, 0.2]}
  seed: {choice: [0, 1]}
defaults: {model: vit_testbed_patch8_32, pretrained: false, max_steps: 12, eval_every: 6, warmup_steps: 2, batch_size: 32}
"""


def test_a_grid_with_seeds_and_criteria_ends_with_the_paper_table_and_the_criteria_lab(ray_local, tmp_path):
    space = tmp_path / "lab.yaml"
    space.write_text(LAB_SPACE)
    options = search.SearchOptions(space=str(space), name="lab", storage=str(tmp_path / "results"),
                                   tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", plasticity_pairs=64, verbose=0)  # fmt: skip
    result = search.run(options)
    assert len(result.trials) == 6 * 2 * 2
    paper = result.analysis.paper.table.set_index("components")
    assert list(paper["n_seeds"]) == [2] * 6 and set(paper["lr"]) <= {0.05, 0.2}
    for config, row in paper.iterrows():  # the lr with the best mean validation accuracy over seeds, test acc there
        runs = result.trials[result.trials["components"] == config]
        assert row["lr"] == runs.groupby("lr")["best_val_acc"].mean().idxmax()
        assert row["mean"] == pytest.approx(runs.loc[runs["lr"] == row["lr"], "test_acc"].mean())
    assert "relative_gain" in paper and paper.loc["head", "relative_gain"] == 0
    lab = result.analysis.criteria.set_index("predictor")
    assert {"plasticity_mean", "in_network_mean", "grad_norm", "rgn", "log_trainable_params"} <= set(lab.index)
    text = results.summary(result)
    assert "Paper protocol" in text and "Which pre-training predictor ranks the subsets" in text
    analysis_dir = tmp_path / "results" / "lab" / "analysis"
    assert {"paper_table.csv", "criteria.csv", "criteria_subsets.csv"} <= {p.name for p in analysis_dir.iterdir()}
