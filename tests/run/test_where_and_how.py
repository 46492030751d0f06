"""Where and how to finetune, end to end: the shipped TPE space (a method per component, depth, learning rate, LoRA
rank) offline on the testbed, and a grid of LoRA subsets at two depths whose best trial's weights come back as a
plain timm model with the trial's own test accuracy."""

import json
from pathlib import Path

import pandas as pd
import pytest
import timm
import torch
from _spaces import space_text
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from vitplast_tune import components, freezing
from vitplast_tune.components import METHOD_FLAGS, component_methods
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.plan import SearchOptions
from vitplast_tune.records import summary
from vitplast_tune.records.tracking import child_runs
from vitplast_tune.run.driver import run as run_search  # the SearchResult of a run, not its Search

pytestmark = pytest.mark.slow


def options(tmp_path, space, name, **changes):
    return SearchOptions(
        space=space,
        name=name,
        storage=str(tmp_path / "results"),
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        plasticity_pairs=64,
        verbose=0,
        **changes,
    )


def test_the_shipped_where_and_how_space_runs_offline_and_labels_its_pareto_points(ray_local, tmp_path):
    settings = {"max_steps": 20, "eval_every": 10}
    result = run_search(options(tmp_path, "where_and_how", "wh", num_samples=8, settings=settings))
    trials = result.trials
    assert len(trials) == 8 and trials["error"].isna().all()
    assert set(trials["depth"]) <= {"first", "middle", "last", "all"} and trials["depth"].nunique() > 1
    assert {"lora", "full"} <= set("+".join(trials["method"]).split("+"))
    for row in trials.itertuples():  # the count each trial reported is its subset's, by method, at its depth
        assert row.method == components.method_label(row.components)
    text = summary(result)
    front = text.split("Pareto front, best validation accuracy vs fewer trainable parameters", 1)[1].split("\n\n")[0]
    assert front.splitlines()[1].split()[:3] == ["components", "method", "depth"]
    assert "Plasticity per component (rows) and layer (columns: block index)" in text
    client = MlflowClient(result.place.tracking_uri)
    for run in child_runs(client, result.parent_run_id):
        params = run.data.params
        subset = params["components"]
        assert params["method"] == components.method_label(subset)
        assert run.info.run_name.startswith(subset + ("" if params["depth"] == "all" else f" @{params['depth']}"))
        assert {k: params[k] for k in METHOD_FLAGS} == component_methods(subset)


GRID = space_text(
    description="LoRA subsets at two depths",
    parameters={
        "components": {"choice": ["mha:lora", "fc1:lora+ln2"]},
        "depth": {"choice": ["first", "last"]},
        "lr": {"choice": [0.2]},
        "seed": {"choice": [0, 1]},
        "lora_rank": 4,
    },
    defaults={"max_steps": 12, "eval_every": 6, "warmup_steps": 2},
)


def test_a_lora_grid_at_two_depths_and_its_best_weights_as_a_plain_timm_model(ray_local, tmp_path):
    space = tmp_path / "grid.yaml"
    space.write_text(GRID)
    result = run_search(options(tmp_path, str(space), "grid"))
    trials = result.trials
    assert len(trials) == 8 and set(trials["components"]) == {"mha:lora", "ln2+fc1:lora"}
    by = trials.groupby(["components", "depth"])["trainable_params"].agg(["min", "max"])
    head = 96 * 10 + 10 + 2 * 96  # the testbed (width 96, MLP 384) on digits: head and final norm
    mha, ln2_fc1 = 4 * ((96 + 288) + (96 + 96)), 2 * 96 + 4 * (96 + 384)  # in one block: thirds of 4 blocks
    assert by.loc[("mha:lora", "first")].tolist() == by.loc[("mha:lora", "last")].tolist() == [head + mha] * 2
    assert by.loc[("ln2+fc1:lora", "last")].tolist() == [head + ln2_fc1] * 2
    assert result.analysis.depth is not None and len(result.analysis.depth.agreement) == 2
    assert "Is a subset's most plastic depth (" in summary(result)

    client = MlflowClient(result.place.tracking_uri)
    directory = Path(client.download_artifacts(result.parent_run_id, "best_trial"))
    about = json.loads((directory / "trial.json").read_text())
    cfg = FinetuneConfig.from_dict(about["settings"])
    assert cfg.components == about["components"] and cfg.depth == about["depth"] and cfg.lora_rank == 4
    weights = load_file(directory / "trainable_weights.safetensors")
    assert any(freezing.is_adapter(name) for name in weights)  # saved as adapters, merged on loading
    from vitplast_tune.data import datasets
    from vitplast_tune.vit import methods, models, training

    model = methods.plain_model(cfg, weights)
    plain = timm.create_model("vit_testbed_patch8_32", pretrained=False, num_classes=10)
    plain.load_state_dict(model.state_dict(), strict=True)
    splits = datasets.load_dataset(cfg.dataset, models.data_config(plain), seed=cfg.seed)
    test = training.evaluate(plain, splits.test, batch_size=cfg.batch_size, device=torch.device("cpu"))
    assert test["acc"] == pytest.approx(about["test_acc"])  # the trial's own test accuracy, from a plain timm model
    table = pd.read_csv(result.place.local_dir / "analysis" / "depth_table.csv")
    assert sorted(zip(table["components"], table["depth"])) == sorted(by.index)  # each subset at each depth once
    at_best = trials.groupby(["components", "depth"])["test_acc"].mean()  # one lr: the best is the only one
    for row in table.itertuples():
        assert row.mean == pytest.approx(at_best.loc[(row.components, row.depth)])
