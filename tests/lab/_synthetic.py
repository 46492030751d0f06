"""Synthetic kept labs in the pre-registered layout (lab.json, trials.csv, curves.csv, test_correct.csv) with a known
answer, and a pre-registration naming them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from vitplast_tune.components import BLOCK_COMPONENTS

BLOCK_SUBSETS = [
    "+".join(c for i, c in enumerate(BLOCK_COMPONENTS) if mask >> i & 1)
    for mask in range(1, 2 ** len(BLOCK_COMPONENTS))
]
PREDICTORS = ["good", "copy", "noise", "plasticity_mean"]


def design_file(folder: Path, **changes) -> Path:
    """A pre-registration for the synthetic labs (models m0, m1; tasks t0..t5)."""
    data = {
        "registered": "2026-12-02",
        "models": {"m0": "model0", "m1": "model1"},
        "candidate_tasks": [f"t{k}" for k in range(6)],
        "seeds": 5,
        "predictors": PREDICTORS,
        "baseline": "log_trainable_params",
        "resampling": {"seeds": "joint", "test_images": "joint", "resamples": 2000, "bootstrap_seed": 0},
        "alpha": 0.05,
        "margin": 0.10,
        "correction": "holm",
        "undecided_mc_se": 3,
        "family": [
            {"claim": "better", "predictor": "each", "scope": "pooled"},
            {"claim": "equivalent", "predictor": "each", "scope": "pooled"},
            {"claim": "narrower", "predictor": "plasticity_mean", "scope": "pooled"},
        ],
        "headline": "random_effects",
    } | changes
    path = Path(folder) / "preregistration.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_lab(folder: Path, task: int, model: str = "model0", *, images: int = 200, seeds=(0, 1, 2, 3, 4)) -> Path:
    """One lab: the 31 block subsets x 3 rates x ``seeds``; a subset's true accuracy rises with its size, a seed
    shifts every subset alike (a crossed factor), each trial's test outcomes are drawn per image. ``good`` is the true
    accuracy (plus a tiny jitter), ``copy`` the baseline itself, ``noise`` unrelated."""
    rng = np.random.default_rng(task + (100 if model != "model0" else 0))
    name = f"lab.{'m0' if model == 'model0' else 'm1'}.t{task}"
    out = Path(folder) / name
    out.mkdir(parents=True, exist_ok=True)
    shift = {s: rng.normal(0, 0.03) for s in seeds}
    trials, correct, curves = [], [], []
    for subset in BLOCK_SUBSETS:
        k = subset.count("+") + 1
        params = 1000 * k * (1 + 0.5 * rng.random())
        quality = 0.45 + 0.07 * k + rng.normal(0, 0.04)
        scores = {"good": quality + rng.normal(0, 1e-4), "copy": np.log(params), "noise": rng.normal()}
        scores["plasticity_mean"] = quality + rng.normal(0, 1e-4)
        for lr in (0.1, 0.3, 1.0):
            for s in seeds:
                acc = float(np.clip(quality - 0.05 * abs(np.log10(lr / 0.3)) + shift[s], 0.02, 0.98))
                outcome = (rng.random(images) < acc).astype(int)
                tid = f"{name}-{len(trials):04d}"
                trials.append(
                    {"trial_id": tid, "stage": "rest", "subset": subset, "method": "full", "lr": lr, "seed": s}
                    | {"steps": 150, "status": "ok", "val_acc": acc + rng.normal(0, 0.005), "val_loss": 1 - acc}
                    | {"test_acc": outcome.mean(), "test_loss": 1 - outcome.mean(), **scores}
                    | {"log_trainable_params": np.log(params), "trainable_params": params, "seconds": 1.0}
                )
                correct.append({"trial_id": tid, "correct": "".join(map(str, outcome))})
                curves += [
                    {"trial_id": tid, "step": st, "seconds": st / 10, "val_acc": acc, "val_loss": 1 - acc}
                    for st in (50, 150)
                ]
    pd.DataFrame(trials).to_csv(out / "trials.csv", index=False)
    pd.DataFrame(correct).to_csv(out / "test_correct.csv", index=False)
    pd.DataFrame(curves).to_csv(out / "curves.csv", index=False)
    record = {"lab": name, "model": model, "task": f"t{task}", "dataset": f"data{task}", "space": "criteria_lab"}
    record |= {"stages": {"rest": {"seconds": 60.0}}, "qualification": {"qualifies": True}}
    (out / "lab.json").write_text(json.dumps(record))
    return out
