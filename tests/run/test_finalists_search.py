"""The baselines' reference trials and the finalists stage end to end, once: a tiny TPE + ASHA search whose reference
trials and finalists train at the whole budget (the finalists on new seeds) as trials of the same search, tagged in
MLflow, kept out of the Optuna study, and answered by."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

import vitplast_tune as vt
from vitplast_tune.plan import SearchOptions
from vitplast_tune.records import summary
from vitplast_tune.records.finalists import final_answer
from vitplast_tune.records.tracking import SEED_TAG, STAGE_TAG, child_runs
from vitplast_tune.run.driver import run


@pytest.mark.slow
def test_a_search_trains_its_finalists_on_new_seeds_records_them_and_answers_by_them(ray_local, tmp_path, tiny_space):
    space = tiny_space(
        algorithm="optuna",
        num_samples=4,
        scheduler={"name": "asha", "grace_period": 4, "reduction_factor": 2},  # rungs at 4 of 8 steps
        parameters={"components": {"choice": ["mha", "fc1"]}, "lr": {"loguniform": [0.01, 0.1]}},
        defaults={"max_steps": 8, "eval_every": 4},
        finalists={"top": 1, "seeds": 2},
        baselines={"rates": 1},  # full finetuning and the probe once each, at lr 10^-1.5 (the middle of the range)
    )
    storage = tmp_path / "results"
    options = SearchOptions(space=str(space), name="fin", storage=str(storage), plasticity=False, verbose=0)
    result = run(options)

    table = pd.read_csv(storage / "fin" / "trials.csv")
    finals, searched = table[table["stage"] == "finalist"], table[table["stage"] == "search"]
    references = table[table["stage"] == "baseline"]
    assert len(searched) == 4 and (searched["seed"] == 0).all()
    assert sorted(references["components"]) == ["all", "head"] and (references["step"] == 8).all()  # never stopped
    assert len(finals) == (1 + 2) * 2 and (finals["step"] == 8).all()  # the whole budget: ASHA passed them over
    assert sorted(finals["seed"].unique()) == [1, 2] and finals.groupby("finalist")["seed"].nunique().eq(2).all()
    baselines = finals[finals["components"].isin(["all", "head"])]
    assert len(baselines) == 4 and (baselines["lr"] == 0.0316).all() and (baselines["lr_from"] == "own").all()

    runs = child_runs(MlflowClient(result.place.tracking_uri), result.parent_run_id)
    tags = sorted((r.data.tags.get(STAGE_TAG), r.data.tags.get(SEED_TAG)) for r in runs)
    assert tags == [("baseline", "0")] * 2 + [("finalist", "1")] * 3 + [("finalist", "2")] * 3 + [("search", "0")] * 4

    study = optuna.load_study(study_name="fin", storage=f"sqlite:///{storage / 'fin' / 'optuna.db'}")
    assert len(study.trials) == 4  # the trials TPE drew alone, as its own study holds them

    text = summary(result)
    first = text.splitlines()[0]
    assert first.startswith("Answer: finetune ") and "(SD over 2 seeds)" in first
    assert "over full finetuning" in first or "it is full finetuning" in first
    assert "over the linear probe" in first or "it is the linear probe" in first
    assert "one-standard-error rule" in text.splitlines()[1] or "no standard error" in text.splitlines()[1]
    assert str(vt.load_search("fin", storage=storage).answer) == first

    chosen = final_answer(table).chosen  # the best model is the answer's configuration, not the best single trial
    search = vt.load_search("fin", storage=storage)
    assert search.total_trials == 4 + 2 + 6 and search.describe()["left"] == 0
    best = search.best_trial
    assert best["stage"] == "finalist" and best["finalist"] == chosen.index
    kept = MlflowClient(result.place.tracking_uri).download_artifacts(result.parent_run_id, "best_trial/trial.json")
    assert json.loads(Path(kept).read_text())["trial_id"] == best["trial_id"]
