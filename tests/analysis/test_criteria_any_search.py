"""The criteria lab at the end of a search that is not a grid (``criteria: true`` on TPE, ``vitplast analyze
--criteria`` on one): each subset at the best of the rates TPE drew, none called "added" beyond a grid the space
does not have (it was refused with "parameter lr is a range; a grid needs {choice: [...]}" before)."""

from __future__ import annotations

import pandas as pd
import yaml

from tests.analysis._tables import grid_trials
from vitplast_tune.analysis import analyze
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.space.files import load_space


def test_the_criteria_lab_runs_on_a_tpe_search(tmp_path, monkeypatch):
    space = {
        "algorithm": "optuna",
        "num_samples": 30,
        "criteria": True,
        "parameters": {"components": {"subsets": "any"}, "lr": {"loguniform": [0.001, 1.0]}},
        "defaults": {"model": "vit_testbed_patch8_32", "pretrained": False, "max_steps": 16},
    }
    (tmp_path / "tpe.yaml").write_text(yaml.safe_dump(space))
    spec = load_space(tmp_path / "tpe.yaml")
    trials = grid_trials().assign(max_steps=16, step=16, val_acc=lambda t: t["best_val_acc"])
    in_network = pd.DataFrame({"in_network_mean": {"mha": 1.0, "fc1": 3.0, "ln1": 2.0, "mha+fc1": 4.0, "head": 0.5}})
    monkeypatch.setattr(analyze, "in_network_scores", lambda *args, **kwargs: in_network)  # measured in a worker
    found = analyze.analyze_search(trials, spec, FinetuneConfig(), tmp_path / "analysis")
    assert found.lab and found.criteria is not None and not found.criteria.empty
    subsets = pd.read_csv(tmp_path / "analysis" / "criteria_subsets.csv").set_index("components")
    assert sorted(subsets.index) == ["fc1", "head", "ln1", "mha", "mha+fc1"]
    assert subsets["added"].fillna("").isin(["", "[]"]).all()  # no grid: no rate is "added" beyond it
