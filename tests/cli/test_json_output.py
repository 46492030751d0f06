"""What ``--json`` prints, from the numbers its text is made of: ``analyze --json``'s answer and correlations,
``recommend --json``'s ranking and evidence, each one JSON document (NaN as null, numpy values as numbers). The
commands themselves print it in tests/cli/test_commands.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from vitplast_tune.analysis.analyze import SearchAnalysis
from vitplast_tune.analysis.prediction import TrialAnalysis
from vitplast_tune.cli.analyze import as_json
from vitplast_tune.cli.base import plain, print_json
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.recommend.ranking import EVIDENCE_COLUMNS, Recommendation, as_plain
from vitplast_tune.records.search import Search
from vitplast_tune.space.files import load_space
from vitplast_tune.storage import SearchPlace


def trial(components, lr, best, params, step=100):
    return {"components": components, "lr": lr, "best_val_acc": best, "val_acc": best, "test_acc": best - 0.01,
            "trainable_params": params, "step": step, "max_steps": 100, "diverged": False, "error": None}  # fmt: skip


def test_plain_makes_tables_dataclasses_and_numpy_values_json(capsys):
    table = pd.DataFrame({"a": [1, 2], "b": [0.5, np.nan]})
    value = {"t": table, "n": np.int64(3), "x": np.float64("nan"), "s": pd.Series({"k": np.float32(0.25)})}
    assert plain(value) == {"t": [{"a": 1, "b": 0.5}, {"a": 2, "b": None}], "n": 3, "x": None, "s": {"k": 0.25}}
    print_json(value)
    assert json.loads(capsys.readouterr().out)["t"][1]["b"] is None


def test_analyze_json_holds_the_answers_numbers_and_the_correlations(tmp_path):
    trials = pd.DataFrame([trial("fc1", 0.1, 0.97, 100_000), trial("all", 0.01, 0.95, 400_000, step=50),
                           trial("head", 0.3, 0.80, 1_000)])  # fmt: skip
    correlations = pd.DataFrame({"predictor": ["plasticity_mean"], "target": ["val_acc"], "spearman": [0.5]})
    place = SearchPlace("s", str(tmp_path), "sqlite:///x.db", "vitplast_tune", "id")
    spec = load_space("component_subsets")
    result = Search(place, {"parent_run_id": "parent"}, trials)
    result.spec, result.settings = spec, FinetuneConfig()
    result.analysis = SearchAnalysis(trials=TrialAnalysis(correlations, pd.DataFrame(), [], 2))
    said = json.loads(json.dumps(plain(as_json(result))))
    assert (said["name"], said["trials"], said["parent_run_id"]) == ("s", 3, "parent")
    assert said["results_dir"] == str(tmp_path / "s")
    answer = said["answer"]
    assert answer["n_trials"] == 3 and answer["best"]["components"] == "fc1" and answer["best"]["best_val_acc"] == 0.97
    baselines = {b["components"]: b for b in answer["baselines"]}
    assert baselines["all"]["kind"] == "stopped" and baselines["all"]["step"] == 50  # like with like: stopped at 50
    assert baselines["head"]["kind"] == "compared" and math.isclose(baselines["head"]["gap"], 17.0)
    assert said["correlations"] == [{"predictor": "plasticity_mean", "target": "val_acc", "spearman": 0.5}]


def test_recommend_json_holds_the_ranking_and_the_evidence():
    ranked = pd.DataFrame({"rank": [1, 2, 3], "components": ["all", "fc1+fc2", "mha"],
                           "trainable_params": [400_000, 200_000, 100_000], "plasticity_mean": [1.0, np.nan, 0.5]})  # fmt: skip
    evidence = pd.DataFrame(columns=list(EVIDENCE_COLUMNS))
    rec = Recommendation("m", "digits", ranked, "log_trainable_params", evidence, budget=None, seconds=1.5)
    said = json.loads(json.dumps(plain(as_plain(rec, top=2))))
    assert [r["components"] for r in said["ranked"]] == ["all", "fc1+fc2"] and said["ranked"][1][
        "plasticity_mean"
    ] is None
    assert (said["model"], said["dataset"], said["criterion"], said["evidence"]) == (
        "m",
        "digits",
        "log_trainable_params",
        [],
    )
    assert said["why"].startswith("no pooled criteria-lab verdict backs another criterion yet")
