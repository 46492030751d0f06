"""Where and how to finetune, end to end: the shipped TPE space (a method per component, depth, learning rate, LoRA
rank) offline on the testbed. LoRA at a depth, merged back into a plain timm model with the trial's predictions, is
tested at unit level (tests/vit/test_methods.py, tests/vit/test_families.py), the depth table on its own
(tests/analysis/test_depth.py)."""

import pytest
from mlflow.tracking import MlflowClient

from vitplast_tune import components
from vitplast_tune.components import METHOD_FLAGS, component_methods
from vitplast_tune.plan import SearchOptions
from vitplast_tune.records import summary
from vitplast_tune.records.tracking import child_runs
from vitplast_tune.run.driver import run as run_search

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
