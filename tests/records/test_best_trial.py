"""From the answer to the model, end to end: a tiny search configured only by MLflow's environment variables lands in
that store and experiment, keeps its artifacts beside the store, tags its best trial, and its best model loads back
(through MLflow and through ``vt.load_best_model``) with the test accuracy the trial reported."""

import json
import math
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient
from timm.models.vision_transformer import VisionTransformer

import vitplast_tune as vt
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.plan import SearchOptions
from vitplast_tune.records import summary, top_trials
from vitplast_tune.records.tracking import BEST_RUN_TAG, BEST_TAG, child_runs
from vitplast_tune.run.driver import run as run_search
from vitplast_tune.vit import training

pytestmark = pytest.mark.slow


def test_a_search_set_by_mlflow_env_vars_lands_there_and_its_best_model_loads_back(
    ray_local, tiny_space, tmp_path, monkeypatch, capsys
):
    store = tmp_path / "store"
    uri = f"sqlite:///{store / 'mlflow.db'}"
    mlflow.set_tracking_uri(None)  # none pinned by an earlier test of this process: the variable decides, as for a user
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team runs")
    space = tiny_space(parameters={"components": {"choice": ["mha", "fc1"]}, "lr": {"choice": [0.3]}})
    result = run_search(SearchOptions(space=str(space), name="envs", plasticity=False, verbose=0))

    client = MlflowClient(uri)  # the store and experiment the variables name, with no flag
    experiment = client.get_experiment_by_name("team runs")
    parent = client.get_run(result.parent_run_id)
    assert (result.place.tracking_uri, result.place.experiment) == (uri, "team runs")
    assert parent.info.experiment_id == experiment.experiment_id and parent.info.status == "FINISHED"
    assert Path(experiment.artifact_location).parent == store / "mlartifacts"  # beside the store
    assert Path(parent.info.artifact_uri).is_relative_to(store / "mlartifacts")
    assert not Path("mlruns").exists() and not Path("mlflow.db").exists()  # nothing in the working directory
    assert mlflow.get_tracking_uri() == uri  # the driver put the process's MLflow settings back

    best = top_trials(result.trials, result.spec, 1).iloc[0]
    children = child_runs(client, result.parent_run_id)
    tagged = [run.info.run_id for run in children if run.data.tags.get(BEST_TAG) == "true"]
    assert len(children) == 2 and tagged == [best["run_id"]] == [result.best_run_id]
    assert parent.data.tags[BEST_RUN_TAG] == best["run_id"]
    own = {a.path for a in client.list_artifacts(best["run_id"], "weights")}
    assert own == {"weights/trainable_weights.safetensors", "weights/trial.json"}  # the best trial's own weights
    text = summary(result)
    link = f"/#/experiments/{experiment.experiment_id}/runs/{best['run_id']}?workflowType=machine_learning"
    assert f"Best trial's run:   http://127.0.0.1:5000{link}" in text
    assert f'mlflow.pytorch.load_model("runs:/{result.parent_run_id}/best_model")' in text

    assert result.best_model_uri == f"runs:/{result.parent_run_id}/best_model"
    info = mlflow.models.get_model_info(result.best_model_uri)
    assert list(info.signature.inputs.to_dict()[0]["tensor-spec"]["shape"]) == [-1, 3, 32, 32]
    assert info.saved_input_example_info is not None and "pytorch" in info.flavors
    settings = json.loads(
        (Path(client.download_artifacts(result.parent_run_id, "best_trial")) / "trial.json").read_text()
    )
    cfg = FinetuneConfig.from_dict(settings["settings"])
    assert cfg.components == best["components"] and cfg.lr == 0.3 and cfg.max_steps == 16
    logged = mlflow.pytorch.load_model(f"runs:/{result.parent_run_id}/best_model")
    capsys.readouterr()
    loaded = vt.load_best_model("envs")
    assert "Downloading artifacts" not in capsys.readouterr().err  # the library prints no other library's bar
    assert math.isfinite(best["test_acc"])
    for model in (logged, loaded):
        assert isinstance(model, VisionTransformer) and not model.training
        assert _test_accuracy(model, cfg) == best["test_acc"]  # the trial's own report


def _test_accuracy(model, cfg: FinetuneConfig) -> float:
    """The model's accuracy on the search's test split, computed as a trial computes it (one thread, its batches)."""
    _, splits = training.build_run(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return training.evaluate(model, splits.test, batch_size=cfg.batch_size, device=torch.device("cpu"))["acc"]
    finally:
        torch.set_num_threads(threads)


def test_a_saved_model_is_logged_to_its_runs_experiment_once_without_loading_it(tmp_path, monkeypatch):
    """The driver's half of the best model: a model saved elsewhere (here a plain pyfunc model) logged as the run's
    ``best_model`` in the run's own experiment (not MLflow's default one in the working directory), found again so
    that a resumed search does not log it twice, and loadable from ``runs:/``."""
    from vitplast_tune.records.best_trial import log_prepared_model, logged_model

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("e", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id

    class Echo(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input):
            return model_input

    mlflow.pyfunc.save_model(str(tmp_path / "saved"), python_model=Echo())
    assert logged_model(client, run_id) is None
    assert log_prepared_model(uri, run_id, tmp_path / "saved") == f"runs:/{run_id}/best_model"
    assert logged_model(client, run_id) == f"runs:/{run_id}/best_model"
    (output,) = client.get_run(run_id).outputs.model_outputs
    model = client.get_logged_model(output.model_id)
    assert model.experiment_id == experiment and Path(model.artifact_location).is_relative_to(tmp_path / "artifacts")
    assert not (tmp_path / "mlruns").exists()
    with mlflow_uri(uri):
        assert mlflow.pyfunc.load_model(f"runs:/{run_id}/best_model").predict([3]) == [3]


def mlflow_uri(uri):
    import contextlib

    @contextlib.contextmanager
    def block():
        previous = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(uri)
        try:
            yield
        finally:
            mlflow.set_tracking_uri(previous)

    return block()


def test_a_best_model_made_in_a_worker_comes_to_the_driver_a_chunk_at_a_time_and_the_workers_folder_goes(
    ray_local, tmp_path
):
    """The object-store path: what the worker made is copied through Ray in calls of at most ``chunk_bytes``, whole,
    and the worker's folder is removed after."""
    from vitplast_tune.records.best_trial import fetch_from_worker
    from vitplast_tune.run.before_trials import measuring_worker

    made = tmp_path / "worker"  # one machine here: the worker's folder is on this disk too
    (made / "best_model" / "data").mkdir(parents=True)
    files = {
        "weights.safetensors": bytes(range(256)) * 41,
        "best_model/data/model.pth": b"m" * 5000,
        "best_model/MLmodel": b"",
    }
    for name, data in files.items():
        (made / name).write_bytes(data)
    calls = []
    with measuring_worker({"cpu": 1}, here=False) as runner:

        def counting(fn, **kwargs):
            out = runner(fn, **kwargs)
            calls.append((getattr(fn, "__name__", ""), len(out) if isinstance(out, bytes) else None))
            return out

        fetch_from_worker(counting, str(made), {n: len(d) for n, d in files.items()}, tmp_path / "driver", 4096)
    assert {n: (tmp_path / "driver" / n).read_bytes() for n in files} == files
    chunks = [size for name, size in calls if name == "_read_chunk"]
    assert chunks == [4096, 4096, 2304, 4096, 904]  # 10,496 and 5,000 bytes in 4 KiB chunks, an empty file in none
    assert calls[-1][0] == "rmtree" and not made.exists()
