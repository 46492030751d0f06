"""End to end: a real local Ray instance, real trials, a real MLflow SQLite store."""

import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from _spaces import space_text
from mlflow.tracking import MlflowClient
from ray.tune import Callback
from safetensors.torch import load_file

from vitplast_tune._compat.mlflow import VIEW_TAG_PREFIX
from vitplast_tune.plan import SearchOptions
from vitplast_tune.records import pareto_front, read_trials, summary, top_trials
from vitplast_tune.records.tracking import FAILURE_TAG, NOTE_TAG, ROLE_TAG, SEARCH_TAG, VIEW_LINK_TAG, child_runs
from vitplast_tune.records.view import DEFAULT_UI, KIND, KIND_TAG
from vitplast_tune.run import measuring_worker, tuner
from vitplast_tune.run.before_trials import measures_here, worker_options
from vitplast_tune.run.driver import run as run_search
from vitplast_tune.search_names import view_key

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SPACE = space_text(
    description="tiny end-to-end grid",
    parameters={"components": {"choice": ["mha", "fc1", "ln1", "ln2+fc2", "all", "head"]}},
    defaults={"max_steps": 24},
)


@pytest.fixture(scope="module")
def finished(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    space = root / "tiny.yaml"
    space.write_text(SPACE)
    options = SearchOptions(
        space=str(space),
        name="tiny",
        storage=str(root / "results"),
        tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
        plasticity_pairs=64,
        verbose=0,
    )
    return run_search(options)


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
    client = MlflowClient(finished.place.tracking_uri)
    parent = client.get_run(finished.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags[SEARCH_TAG] == "tiny" and parent.data.tags[ROLE_TAG] == "search"
    assert parent.data.params["space"] == "tiny" and parent.data.params["algorithm"] == "grid"
    assert "lr" not in parent.data.params and "components" not in parent.data.params  # trial-varying: on trials only
    assert parent.data.params["default.lr"] == "0.1" and parent.data.params["default.max_steps"] == "24"
    assert parent.data.tags["mlflow.source.name"] and parent.data.tags["mlflow.user"]
    assert "val_acc_common" in parent.data.tags[NOTE_TAG]
    children = child_runs(client, finished.parent_run_id)
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
        assert run.data.tags[ROLE_TAG] == "trial" and run.data.tags[SEARCH_TAG] == "tiny"
        assert run.data.tags["mlflow.source.name"] and run.data.tags["mlflow.user"]
        inputs = run.inputs.dataset_inputs
        contexts = {i.dataset.name: {t.key: t.value for t in i.tags}["mlflow.data.context"] for i in inputs}
        assert contexts == {"digits-train": "training", "digits-val": "validation"}
        assert metrics["n_components"] == (6 if subset == "all" else subset.count("+") + (subset != "head"))
        assert metrics["log10_lr"] == pytest.approx(math.log10(0.05))
        row = finished.trials.set_index("run_id").loc[run.info.run_id]
        assert row["components"] == subset and metrics["val_acc_common"] == row["val_acc_common"]
        assert metrics["trainable_params"] == row["trainable_params"] > 0
        assert metrics["log10_trainable_params"] == pytest.approx(math.log10(row["trainable_params"]))
        assert metrics["best_val_loss"] == min(m.value for m in client.get_metric_history(run.info.run_id, "val_loss"))
        for key in ("best_val_loss", "test_acc"):  # once, at the end
            assert len(client.get_metric_history(run.info.run_id, key)) == 1, key
        for key in (
            "val_acc_common",
            "trainable_params",
            "log10_trainable_params",
        ):  # as trials report, then at the end
            assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == [8, 16, 24, 24], key
        assert len(client.get_metric_history(run.info.run_id, "best_val_acc")) == 3
        if subset != "head":
            assert metrics["plasticity_mean"] > 0 and metrics["plasticity_max"] >= metrics["plasticity_mean"]


def test_parent_run_has_plasticity_and_correlations(finished):
    client = MlflowClient(finished.place.tracking_uri)
    parent = client.get_run(finished.parent_run_id)
    artifacts = {
        a.path for folder in ("plasticity", "analysis") for a in client.list_artifacts(finished.parent_run_id, folder)
    }
    assert {
        "plasticity/plasticity.csv",
        "plasticity/plasticity.png",
        "analysis/correlations.csv",
        "analysis/plasticity_mean_vs_val_acc.png",
        "analysis/log_trainable_params_vs_val_acc.png",
    } <= artifacts
    assert set(parent.data.metrics) == {"best_val_acc", "best_test_acc", "num_trials", "elapsed_s"}  # the headlines
    corr = _table(client, finished.parent_run_id, "analysis/correlations.json").set_index(["target", "predictor"])
    assert corr.loc[("val_acc", "plasticity_mean"), "n"] == 5  # the head-only trial has no plasticity score
    assert -1 <= corr.loc[("val_acc", "plasticity_mean"), "spearman"] <= 1
    assert corr.loc[("val_acc", "log_trainable_params"), "n"] == 6
    assert ("relative_gain", "plasticity_mean") in corr.index  # the grid has a linear probe
    assert corr.loc[("val_acc_common", "log_trainable_params"), "n"] == 6  # every trial at the common step
    ranking = _table(client, finished.parent_run_id, "plasticity/ranking.json")
    assert ranking.set_index("component").loc["mha", "plasticity"] > 0


def test_parent_run_has_best_trial_weights(finished):
    client = MlflowClient(finished.place.tracking_uri)
    directory = client.download_artifacts(finished.parent_run_id, "best_trial")
    about = json.loads(Path(directory, "trial.json").read_text())
    best = top_trials(finished.trials, finished.spec, 1).iloc[0]
    assert about["trial_id"] == best["trial_id"] and about["components"] == best["components"]
    weights = load_file(f"{directory}/trainable_weights.safetensors")
    assert sum(t.numel() for t in weights.values()) == best["trainable_params"]  # the trainable parameters only
    assert all(isinstance(t, torch.Tensor) for t in weights.values())


def test_trials_csv_keeps_ids_as_text(finished):
    trials = read_trials(finished.place.local_dir)
    assert trials["trial_id"].tolist() == finished.trials["trial_id"].tolist()
    client = MlflowClient(finished.place.tracking_uri)
    assert set(trials["run_id"]) == {r.info.run_id for r in child_runs(client, finished.parent_run_id)}
    table = _table(client, finished.parent_run_id, "trials.json")
    assert table["trial_id"].tolist() == trials["trial_id"].tolist()


def test_saved_view_and_link(finished):
    client = MlflowClient(finished.place.tracking_uri)
    parent = client.get_run(finished.parent_run_id)
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags[KIND_TAG] == KIND
    key = view_key("tiny")
    envelope = json.loads(experiment.tags[VIEW_TAG_PREFIX + key])
    state = json.loads(envelope["state"])
    assert state["searchFilter"] == "tags.`vitplast.search` = 'tiny' and tags.`vitplast.role` = 'trial'"
    assert state["runsHiddenMode"] == "SHOW_ALL" and state["orderByKey"] == "metrics.`val_acc_common`"
    assert {c["type"] for c in state["compareRunCharts"]} == {"SCATTER", "PARALLEL", "LINE"}
    link = parent.data.tags[VIEW_LINK_TAG]
    assert link == finished.view.link and f"viewStateShareKey={key}" in link and "workflowType=machine_learning" in link
    assert link.startswith(f"{DEFAULT_UI}/#/experiments/{experiment.experiment_id}/runs?")
    assert link in parent.data.tags[NOTE_TAG]


def test_summary_names_results_and_mlflow_command(finished):
    text = summary(finished)
    assert "Top 6 trials" in text
    assert (
        f"MLflow runs:        {finished.place.tracking_uri}   (experiment 'vitplast_tune', parent run 'tiny')" in text
    )
    assert f"MLflow UI:          vitplast ui tiny --storage {finished.place.storage}" in text
    assert f"MLflow view:        {finished.view.link}" in text
    assert "log_trainable_params" in text and "Spearman" in text


def test_measurements_run_in_one_ray_worker_with_a_trials_resources(ray_local):
    from vitplast_tune.vit.measure import task_context

    assert worker_options({"cpu": 2, "gpu": 0.25, "a100": 1}) == {
        "num_cpus": 2.0,
        "num_gpus": 1,
        "resources": {"a100": 1.0},
        "max_restarts": 0,
    }
    with measuring_worker({"cpu": 0.5, "gpu": 0}, here=False) as run:
        where = run(task_context)
        assert run(os.getpid) == run(os.getpid) != os.getpid()  # both measurements in one process, not the driver's
    assert where["resources"] == {"CPU": 0.5}
    assert where["node_id"] in {n["NodeID"] for n in ray_local.nodes()}


def test_a_driver_that_holds_torch_measures_for_cpu_trials_itself():
    """This process holds torch: a worker would only import it again, unless a trial asks for a GPU or another
    resource the driver's node may lack. (A driver without torch, as the search command's, is tested in
    tests/cli/test_commands.py: it holds no torch at its end.)"""
    assert measures_here({"cpu": 2}) and measures_here({"cpu": 1, "gpu": 0, "memory": 1e9})
    assert not measures_here({"cpu": 1, "gpu": 0.5}) and not measures_here({"cpu": 1, "trainer": 1})
    with measuring_worker({"cpu": 2}) as run:
        assert run(os.getpid) == os.getpid() and run(dict, a=1) == {"a": 1}


def test_the_measuring_worker_exits_with_its_block(ray_local):
    """The worker that measured (torch, a model, its allocator's leftovers) does not idle through the search."""

    with measuring_worker({"cpu": 0.5, "gpu": 0}, here=False) as run:
        pid = run(os.getpid)
        assert Path(f"/proc/{pid}").exists()
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), f"worker {pid} still runs after the measurements"


IDLE_WORKERS = """
import os, sys
from pathlib import Path
import ray
from vitplast_tune.run import cluster

TICK = os.sysconf("SC_CLK_TCK")


def started():  # when each worker process of this instance started, in seconds since boot
    mark = ("RAY_TMPDIR=" + os.environ["RAY_TMPDIR"]).encode()  # their environment names our RAY_TMPDIR
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\\0"):
                if (entry / "cmdline").read_bytes().startswith(b"ray::IDLE"):  # a worker between tasks
                    found.append(int((entry / "stat").read_text().rsplit(")", 1)[1].split()[19]) / TICK)
        except OSError:
            pass
    return found


cluster.init(None)
# Ray's prestart forks one worker per CPU while the driver registers, inside ray.init; without it, workers start
# when a task asks for one. So no worker may have started before the first task was submitted.
submitted = float(Path("/proc/uptime").read_text().split()[0])
ray.get(ray.remote(lambda: 1).remote())
times = started()
print(sum(t < submitted for t in times), len(times))
ray.shutdown()
"""


def test_a_local_instance_starts_no_idle_workers_ahead():
    with tempfile.TemporaryDirectory(prefix="vti", dir="/tmp") as tmp:  # short: Ray's socket paths are limited
        env = {**os.environ, "RAY_TMPDIR": tmp, "RAY_ADDRESS": ""}
        out = subprocess.run([sys.executable, "-c", IDLE_WORKERS], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    ahead, workers = map(int, out.stdout.split()[-2:])
    assert ahead == 0, f"{ahead} workers started before any task was submitted"
    assert workers >= 1  # the count sees the worker that ran the task (it stays, idle, to be reused)


def test_the_search_measured_its_predictors_in_a_ray_task(finished):
    client = MlflowClient(finished.place.tracking_uri)
    paths = {a.path for a in client.list_artifacts(finished.parent_run_id, "criteria")}
    assert paths == {"criteria/gradients.csv", "criteria/gradients_summary.csv"}
    assert {"grad_norm", "grad_norm_ratio", "auto_rgn"} <= set(finished.trials.columns)
    assert (finished.trials.loc[finished.trials["components"] != "head", "auto_rgn"] > 0).all()
    gradients = pd.read_csv(client.download_artifacts(finished.parent_run_id, "criteria/gradients.csv"))
    assert gradients["head_seed"].nunique() == 5  # the mean over five head initialisations


LAB_SPACE = space_text(
    description="tiny criteria lab",
    criteria=True,
    parameters={
        "components": {"choice": ["mha", "fc1", "ln2+fc2", "head"]},
        "lr": {"choice": [0.05, 0.2]},
        "seed": {"choice": [0, 1]},
    },
    defaults={"max_steps": 12, "eval_every": 6, "warmup_steps": 2},
    budgets=[12, {"steps": 18, "lr": [0.2], "seed": [1]}],
)


def test_a_grid_with_seeds_and_criteria_ends_with_the_paper_table_and_the_criteria_lab(ray_local, tmp_path):
    space = tmp_path / "lab.yaml"
    space.write_text(LAB_SPACE)
    options = SearchOptions(
        space=str(space),
        name="lab",
        storage=str(tmp_path / "results"),
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        plasticity_pairs=64,
        verbose=0,
    )
    result = run_search(options)
    assert len(result.trials) == 4 * 2 * 2 + 4  # the grid at 12 steps, then 4 subsets at lr 0.2, seed 1, 18 steps
    long = result.trials[result.trials["max_steps"] == 18]
    assert len(long) == 4 and set(long["lr"]) == {0.2} and set(long["seed"]) == {1} and (long["step"] == 18).all()
    short = result.trials[result.trials["max_steps"] == 12]
    first = result.analysis.budgets[0]
    assert [part.budget for part in result.analysis.budgets] == [12, 18]
    paper = first.paper.table.set_index("components")
    assert list(paper["n_seeds"]) == [2] * 4 and set(paper["lr"]) <= {0.05, 0.2}
    for config, row in paper.iterrows():  # the lr with the best mean validation accuracy over seeds, test acc there
        runs = short[short["components"] == config]
        assert row["lr"] == runs.groupby("lr")["best_val_acc"].mean().idxmax()
        assert row["mean"] == pytest.approx(runs.loc[runs["lr"] == row["lr"], "test_acc"].mean())
    assert "relative_gain" in paper and paper.loc["head", "relative_gain"] == 0
    lab = result.analysis.criteria
    assert set(lab["budget"]) == {12, 18}
    assert {"plasticity_mean", "in_network_mean", "grad_norm", "auto_rgn", "log_trainable_params"} <= set(
        lab["predictor"]
    )
    # two rates at 12 steps, one at 18: every subset's best rate is at an end of its rates, so none is in the verdict
    subsets = pd.read_csv(tmp_path / "results" / "lab" / "analysis" / "criteria_subsets.csv")
    assert set(subsets["position"]) <= {"low edge", "high edge", "one rate"} and not subsets["in_verdict"].any()
    assert (lab["n"] == 0).all() and set(lab["note"]) == {"too few subsets (n < 5)"}
    text = summary(result)
    assert "Paper protocol" in text and "Which pre-training predictor ranks the subsets" in text
    assert "=== Budget 12 steps ===" in text and "=== The criteria lab, every budget in one family" in text
    assert "left out of the verdict" in text and "No verdict on the subsets: too few subsets (n < 5)" in text
    analysis_dir = tmp_path / "results" / "lab" / "analysis"
    assert {"criteria.csv", "criteria_subsets.csv", "criteria_agreement.csv"} <= {
        p.name for p in analysis_dir.iterdir()
    }
    for budget in (12, 18):
        assert "paper_table.csv" in {p.name for p in (analysis_dir / f"steps-{budget}").iterdir()}


def _table(client: MlflowClient, run_id: str, path: str) -> pd.DataFrame:
    """A table logged with log_table, values as stored (no type guessing)."""
    text = Path(client.download_artifacts(run_id, path)).read_text()
    return pd.read_json(io.StringIO(text), orient="split", dtype=False)


def test_pareto_fronts_printed_logged_and_throughput_on_child_runs(finished):
    trials = finished.trials
    assert (trials["images_per_s"] > 0).all() and not trials["over_budget"].any()
    text = summary(finished)
    assert text.index("Top 6 trials") < text.index(
        "Pareto front, best validation accuracy vs fewer trainable parameters"
    )
    assert "Pareto front, best validation accuracy vs more training images/s" in text
    client = MlflowClient(finished.place.tracking_uri)
    artifacts = {a.path for a in client.list_artifacts(finished.parent_run_id, "pareto")}
    assert {
        "pareto/pareto_trainable_params.csv",
        "pareto/pareto_trainable_params.png",
        "pareto/pareto_images_per_s.png",
    } <= artifacts
    assert pareto_front(trials, "trainable_params")["components"].iloc[0] == "head"  # the cheapest trial
    for run in child_runs(client, finished.parent_run_id):
        assert run.data.metrics["images_per_s"] > 0


class Reports(Callback):
    def __init__(self):
        self.seen = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.seen.append(result.get("stand_in"))


def test_a_search_runs_the_trainable_it_is_given(ray_local, tmp_path):
    """The driver's seam for another trainable (benchmarks.scale measures the driver alone with one): every record
    of the search as usual (MLflow runs, the study, the trial table), no best model where no checkpoint was made."""
    from vitplast_tune.plan import prepare
    from vitplast_tune.run import execute

    def stand_in(config):  # defined here, so that Ray pickles it by value (the workers cannot import the tests)
        from ray import tune

        for step in (8, 16):
            tune.report({"step": step, "max_steps": 16, "val_acc": 0.5, "best_val_acc": 0.5, "stand_in": 1})

    space = tmp_path / "two.yaml"
    space.write_text(space_text(parameters={"components": {"choice": ["mha", "fc1"]}}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    options = SearchOptions(space=str(space), name="cheap", storage=str(tmp_path), tracking_uri=uri, verbose=0)
    reports = Reports()
    result = execute(prepare(SearchOptions(**{**vars(options), "plasticity": False})), [reports], trainable=stand_in)
    assert reports.seen == [1] * 4  # two trials, two reports each, all the stand-in's
    assert sorted(result.trials["components"]) == ["fc1", "mha"] and (result.trials["step"] == 16).all()
    client = MlflowClient(uri)
    assert client.get_run(result.parent_run_id).info.status == "FINISHED"
    assert [r.info.status for r in child_runs(client, result.parent_run_id)] == ["FINISHED"] * 2
    assert result.best_model_uri is None and result.best_run_id is None  # no checkpoint: nothing to build
    assert [t.state.name for t in result.study.trials] == ["COMPLETE"] * 2


def test_a_search_whose_every_trial_fails_ends_failed_with_the_first_trials_cause(ray_local, tmp_path, capsys):
    """No trial reported a validation accuracy: no answer, so not a success; SearchFailed names the first trial's own
    exception (not Ray's wrapper), the parent run ends FAILED with it, and the command exits 1 with one line."""
    from vitplast_tune.cli.base import run_main
    from vitplast_tune.errors import SearchFailed
    from vitplast_tune.plan import prepare
    from vitplast_tune.run import execute

    def failing(config):  # defined here, so that Ray pickles it by value
        from vitplast_tune.errors import UserError

        raise UserError(f"cannot train {config['components']}\nsecond line")

    space = tmp_path / "two.yaml"
    space.write_text(space_text(parameters={"components": {"choice": ["mha", "fc1"]}}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    options = SearchOptions(
        space=str(space), name="doomed", storage=str(tmp_path), tracking_uri=uri, verbose=0, max_failures=0
    )
    with pytest.raises(SearchFailed) as failed:
        execute(prepare(SearchOptions(**{**vars(options), "plasticity": False})), trainable=failing)
    said = str(failed.value)
    assert 'no trial of search "doomed" reported a validation accuracy: 2 of 2 failed' in said
    assert "the first with UserError: cannot train mha;" in said and "second line" not in said
    parent = json.loads((tmp_path / "doomed" / "vitplast_search.json").read_text())["parent_run_id"]
    client = MlflowClient(uri)
    assert client.get_run(parent).info.status == "FAILED"
    assert "cannot train mha" in client.get_run(parent).data.tags[FAILURE_TAG]
    assert "RUNNING" not in {r.info.status for r in child_runs(client, parent)}

    def search_main():
        raise failed.value

    capsys.readouterr()  # what the search printed
    with pytest.raises(SystemExit) as exited:
        run_main(search_main)
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {said}"]


def test_each_trial_keeps_its_two_latest_checkpoints_the_latest_holding_its_best_weights(finished):
    """The footprint: a finished trial keeps its two latest checkpoints (Tune's saved state may name the one before
    the newest: tests/run/test_reliability.py's SIGKILLed driver), not every one it reported (eval_every 8 over 24
    steps: three), and the latest holds its best-validation weights."""
    trials = sorted(finished.place.local_dir.glob("trial_*"))
    assert len(trials) == 6
    for trial in trials:
        kept = sorted(trial.glob("checkpoint_*"))
        assert 1 <= len(kept) <= tuner.KEEP_CHECKPOINTS == 2, kept
        assert (kept[-1] / "best.safetensors").is_file()
