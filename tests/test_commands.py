"""Every console command end to end, as a user runs it (``python -m vitplast_tune COMMAND``, a process of its own,
its own Ray instance), at tiny step counts: pretrain, a random search with median stopping and analyze on it, and
recommend --verify."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pandas as pd
import pytest
from safetensors.torch import load_file

from tests._spaces import space_text
from vitplast_tune.config import TESTBED_MODEL

pytestmark = pytest.mark.slow


def command(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m vitplast_tune ARGS``; fails the test with its output when it does not exit 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "vitplast_tune", *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_pretrain_writes_weights_the_model_loads_and_their_provenance(tmp_path):
    out = tmp_path / "testbed.safetensors"
    flags = ["--steps", "12", "--batch-size", "16", "--num-classes", "4", "--images-per-class", "8"]
    proc = command("pretrain", "--out", str(out), *flags, "--heldout-per-class", "2", "--log-every", "4")
    assert f"wrote {out}" in proc.stdout
    provenance = json.loads(out.with_suffix(".json").read_text())
    assert provenance["steps"] == 12 and provenance["num_classes"] == 4 and provenance["file"] == out.name
    assert provenance["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert 0.0 <= provenance["heldout_accuracy"] <= 1.0
    from vitplast_tune.vit import models

    model = models.create_model(TESTBED_MODEL, 10, pretrained=True, weights=str(out))  # a new head of 10 classes
    written = load_file(str(out))
    blocks = {k: v for k, v in written.items() if not k.startswith("head.")}
    state = model.state_dict()
    assert blocks and all((state[k] == v).all() for k, v in blocks.items())  # the backbone is the written one
    assert written["head.weight"].shape[0] == 4 and state["head.weight"].shape[0] == 10


def test_a_random_search_with_median_stopping_then_analyze_on_its_record(tmp_path):
    space = tmp_path / "random.yaml"
    space.write_text(
        space_text(
            algorithm="random",
            scheduler={"name": "median", "grace_period": 4},
            num_samples=4,
            parameters={"components": {"choice": ["mha", "fc1", "ln1+ln2", "head"]}, "lr": {"loguniform": [0.01, 1]}},
            defaults={"max_steps": 16, "eval_every": 4},
        )
    )
    storage = tmp_path / "results"
    proc = command("search", "--space", str(space), "--name", "rnd", "--storage", str(storage), "--no-plasticity")
    assert "(random, scheduler median," in proc.stdout
    trials = pd.read_csv(storage / "rnd" / "trials.csv")
    assert len(trials) == 4 and trials["step"].between(4, 16).all() and trials["val_acc"].between(0, 1).all()
    assert set(trials["components"]) <= {"mha", "fc1", "ln1+ln2", "head"}
    assert trials["lr"].between(0.01, 1).all() and trials["lr"].nunique() == 4  # random: four different draws

    again = command("analyze", "--name", "rnd", "--storage", str(storage))
    best = trials.sort_values("best_val_acc", ascending=False).iloc[0]
    assert f"Results (Ray Tune): {storage}/rnd" in again.stdout and best["components"] in again.stdout


def test_recommend_then_verify_with_a_short_grid(tmp_path):
    storage = tmp_path / "results"
    proc = command(
        "recommend",
        "--storage",
        str(storage),
        "--plasticity-pairs",
        "32",
        "--top",
        "3",
        "--verify",
        "1",
        "--verify-steps",
        "8",
        timeout=900,
    )
    out = proc.stdout
    assert "Verification (each configuration at its best-validation lr; ranked by test accuracy)" in out
    assert "the recommendation held" in out or "the recommendation did NOT hold" in out
    verified = [p for p in storage.iterdir() if p.is_dir() and (p / "trials.csv").is_file()]
    assert len(verified) == 1
    trials = pd.read_csv(verified[0] / "trials.csv")
    assert {"all", "head"} <= set(trials["components"]) and len(set(trials["components"])) == 3
    assert (trials["step"] == 8).all()
