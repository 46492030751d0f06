"""Every console command end to end, as a user runs it (``python -m vitplast_tune COMMAND``, a process of its own,
its own Ray instance), at tiny step counts: pretrain, a random search with median stopping (its driver free of
torch while trials train) and analyze on it, analyze of two searches (the cross-dataset table; the searches run
in this process), and recommend --verify."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
from safetensors.torch import load_file

from tests._spaces import space_text
from vitplast_tune.config import TESTBED_MODEL
from vitplast_tune.plan import SearchOptions
from vitplast_tune.run.driver import run as run_search

pytestmark = pytest.mark.slow


def command(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m vitplast_tune ARGS`` (``env``: added to this process's environment); fails the test with its
    output when it does not exit 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "vitplast_tune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_pretrain_writes_weights_the_model_loads_and_their_provenance(tmp_path):
    out = tmp_path / "testbed.safetensors"
    flags = ["--steps", "12", "--batch-size", "16", "--num-classes", "4", "--images-per-class", "8"]
    proc = command("pretrain", "--out", str(out), *flags, "--heldout-per-class", "2", "--log-every", "4")
    assert f"wrote {out}" in proc.stderr  # a note (stderr); stdout is for answers
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


LEAN_PROBE = """
import atexit, json, os, sys
from ray import tune


def heavy(when):
    with open(os.environ["LEAN_PROBE_OUT"], "a") as out:
        out.write(json.dumps([when, [m for m in ("torch", "timm", "torchvision") if m in sys.modules]]) + "\\n")


atexit.register(heavy, "exit")  # once the command has done everything: results, best model, study, analysis


class Probe(tune.Callback):  # named in RAY_TUNE_CALLBACKS: Ray Tune adds it to the search's own
    def on_trial_result(self, iteration, trials, trial, result, **info):
        heavy("report")
"""


def test_a_random_search_with_median_stopping_then_analyze_on_its_record(tmp_path):
    """The search command: a random search under median stopping, its plasticity measured; its driver holds no
    torch, timm or torchvision (0.4 GB) while trials train nor at its end (it validates and decodes in a child
    process, measures, trains and builds the best model in Ray workers: a callback in the driver looks at each report,
    an exit hook at the end); then analyze on its record."""
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
    (tmp_path / "lean_probe.py").write_text(LEAN_PROBE)
    seen = tmp_path / "seen.jsonl"
    probe = {"RAY_TUNE_CALLBACKS": "lean_probe.Probe", "LEAN_PROBE_OUT": str(seen)}
    probe["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
    storage = tmp_path / "results"
    flags = ["--storage", str(storage), "--plasticity-pairs", "16"]
    proc = command("search", "--space", str(space), "--name", "rnd", *flags, env=probe)
    assert "(random, scheduler median," in proc.stdout
    trials = pd.read_csv(storage / "rnd" / "trials.csv")
    assert len(trials) == 4 and trials["step"].between(4, 16).all() and trials["val_acc"].between(0, 1).all()
    assert set(trials["components"]) <= {"mha", "fc1", "ln1+ln2", "head"}
    assert trials["lr"].between(0.01, 1).all() and trials["lr"].nunique() == 4  # random: four different draws
    probed = [json.loads(line) for line in seen.read_text().splitlines()]
    assert [when for when, _ in probed] == ["report"] * (trials["step"] // 4).sum() + ["exit"]  # every evaluation, then
    assert all(heavy == [] for _, heavy in probed), probed
    assert "Best model:         mlflow.pytorch.load_model(" in proc.stdout  # built, in a worker

    again = command("analyze", "--name", "rnd", "--storage", str(storage))
    best = trials.sort_values("best_val_acc", ascending=False).iloc[0]
    assert f"Results (Ray Tune): {storage}/rnd" in again.stdout and best["components"] in again.stdout
    top = trials[trials["best_val_acc"] == trials["best_val_acc"].max()]
    answer = again.stdout.splitlines()[0]  # the answer first: one of the best trials, as an instruction
    assert any(answer.startswith(f"Answer: finetune {c} at lr ") for c in top["components"]), answer
    assert "Search rnd: 4 trials (random" in again.stdout  # no elapsed time: analyze did not time the search
    assert "Downloading artifacts" not in again.stdout + again.stderr  # no progress bar of MLflow's
    # analyze --json: tests/records/test_search.py


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
    top = re.search(r"top-ranked subset (\S+):", out).group(1)  # by the parameter count (no lab recorded): all
    assert set(trials["components"]) == {"all", "head", top}
    assert (trials["step"] == 8).all()

    said = json.loads(
        command("recommend", "--storage", str(storage), "--plasticity-pairs", "32", "--top", "3", "--json").stdout
    )
    assert said["criterion"] in said["ranked"][0] and len(said["ranked"]) == 3
    assert said["ranked"][0]["components"] == top and [r["rank"] for r in said["ranked"]] == [1, 2, 3]
    assert said["model"] == TESTBED_MODEL and said["dataset"] == "digits" and isinstance(said["evidence"], list)


def test_analyze_of_two_searches_writes_the_cross_dataset_table(ray_local, tmp_path):
    """One paper-protocol grid per dataset (the linear probe, three components, two seeds), then ``analyze`` with
    both names: the relative gains over the probe, per dataset and their mean, as computed here from trials.csv.
    The two searches are this test's set-up, run in this process on its Ray instance (what ``search`` writes is
    the command line's; its own test is the random search's): the command under test is ``analyze``."""
    grid = tmp_path / "grid.yaml"
    components = ["head", "mha", "fc1", "fc2"]
    parameters = {"components": {"choice": components}, "lr": {"choice": [0.05]}, "seed": {"choice": [0, 1]}}
    grid.write_text(space_text(parameters=parameters, defaults={"max_steps": 8, "eval_every": 8}))
    storage = tmp_path / "results"
    for name, dataset, reference in (("dig", "digits", "fractals"), ("fra", "fractals", "digits")):
        options = SearchOptions(
            str(grid),
            name=name,
            storage=str(storage),
            settings={"dataset": dataset},
            plasticity_reference=reference,
            plasticity_pairs=32,
            verbose=0,
        )
        run_search(options)

    out = command("analyze", "--name", "dig", "--name", "fra", "--storage", str(storage)).stdout
    said = json.loads(command("analyze", "--name", "dig", "--name", "fra", "--storage", str(storage), "--json").stdout)
    assert said["names"] == ["dig", "fra"] and said["files"] == str(storage / "cross-dig-fra")
    assert {r["components"] for r in said["gains"]} == {"head", "mha", "fc1", "fc2"}  # the probe's own row too
    assert len(said["agreement"]) == 3, said["agreement"]
    assert "Relative gain over the linear probe per configuration and dataset" in out
    assert f"files: {storage / 'cross-dig-fra'}" in out
    gains = pd.read_csv(storage / "cross-dig-fra" / "cross_dataset_gains.csv").set_index("components")
    for name in ("dig", "fra"):
        trials = pd.read_csv(storage / name / "trials.csv")
        assert len(trials) == 8 and set(trials["seed"]) == {0, 1}
        test_acc = trials.groupby("components")["test_acc"].mean()  # one lr: its mean over the two seeds
        expected = (test_acc - test_acc["head"]) / test_acc["head"]
        assert gains[name].to_dict() == pytest.approx(expected[gains.index].to_dict(), abs=1e-9)
    assert gains["mean_gain"].to_numpy() == pytest.approx(gains[["dig", "fra"]].mean(axis=1).to_numpy())
    agreement = pd.read_csv(storage / "cross-dig-fra" / "cross_dataset_agreement.csv")
    assert list(agreement["dataset"]) == ["dig", "fra", "pooled"] and (agreement["n"] == 3).all()
    assert agreement["spearman"].between(-1, 1).all()  # mha, fc1, fc2: each search measured their plasticity
