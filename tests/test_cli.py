"""Bad input: one clear line on stderr, exit code 2, quickly, and no Ray session or MLflow store."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vitplast_tune.search.spaces import load_space

ROOT = Path(__file__).resolve().parents[1]
GOOD = """
metric: val_acc
mode: max
algorithm: optuna
num_samples: 2
scheduler: asha
parameters:
  components: {subsets: any}
  lr: {loguniform: [1.0e-3, 1.0]}
defaults: {model: vit_testbed_patch8_32, pretrained: false, max_steps: 8}
"""


def ray_sessions() -> set[str]:
    """The Ray sessions in this test's own Ray temp dir (conftest gives each test one, and its subprocesses use it)."""
    return {p.name for p in (Path(os.environ["RAY_TMPDIR"]) / "ray").glob("session_*")}


def run_search(tmp_path, *args, space_text=GOOD, timeout=120):
    space = tmp_path / "space.yaml"
    space.write_text(space_text)
    storage = tmp_path / "results"
    assert ray_sessions() == set()
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "search.py"), "--space", str(space), "--storage", str(storage), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    return proc, time.perf_counter() - started, storage


CASES = [
    ([], GOOD.replace("mode: max", "mode: [max"), "malformed YAML"),
    ([], GOOD.replace("num_samples", "num_sample"), 'did you mean "num_samples"'),
    ([], GOOD.replace("{subsets: any}", "[mha, mlp]"), 'unknown component "mlp"'),
    ([], GOOD.replace("{subsets: any}", "[]"), "empty or malformed component subset"),
    ([], GOOD.replace("[1.0e-3, 1.0]", "[0, 1.0]"), "loguniform range must be positive"),
    ([], GOOD.replace("[1.0e-3, 1.0]", "[1.0, 1.0e-3]"), "empty or inverted"),
    ([], GOOD.replace("lr: {loguniform: [1.0e-3, 1.0]}", "lr: -0.1"), "lr must be positive"),
    ([], GOOD.replace("algorithm: optuna", "algorithm: bayes"), 'unknown algorithm "bayes"'),
    ([], GOOD.replace("scheduler: asha", "scheduler: pbt"), 'unknown scheduler "pbt"'),
    (["--model", "vit_bace_patch16_224"], GOOD, 'unknown timm model "vit_bace_patch16_224"'),
    (["--dataset", "cifar10", "--data-dir", "{tmp}/nothing"], GOOD, 'dataset "cifar10" not found'),
    (["--dataset", "imagefolder", "--data-dir", "{tmp}/nothing"], GOOD, "image folder"),
    (["--weights", "{tmp}/nope.safetensors"], GOOD, "nope.safetensors does not exist"),
    (["--weights", "{tmp}/space.yaml"], GOOD, "space.yaml is unreadable or corrupt"),
    ([], GOOD.replace("metric: val_acc", "metric: accuracy"), 'metric "accuracy" is not reported by trials'),
    ([], GOOD.replace("mode: max", "mode: min"), 'mode "min" would search for the worst val_acc'),
    (["--cpus-per-trial", "-1"], GOOD, "must not be negative"),
    (["--max-steps", "0"], GOOD, "max_steps must be positive"),
    (["--storage", "/proc/vitplast"], GOOD, "not writable"),
    (["--resume", "--name", "never-ran"], GOOD, 'no search "never-ran" to resume'),
    (["--resume", "--name", "started", "--max-steps", "16"], GOOD, "--max-steps 16 differs from the 8"),
    (["--resume", "--name", "corrupt"], GOOD, "is unreadable"),
    (["--set", "lr=fast"], GOOD, "--set lr=fast: lr takes a number, not 'fast'"),
    (["--set", "max_stesp=9"], GOOD, 'unknown setting "max_stesp" (did you mean "max_steps"?)'),
    (["--set", "blocks=a,b"], GOOD, "blocks takes a list of integers such as 0,1,2 or none"),
    (["--set", "compile=maybe"], GOOD, "compile takes true or false"),
    (["--max-steps", "8", "--set", "max_steps=9"], GOOD, "--set max_steps=9 contradicts --max-steps 8"),
    (["--set", "precision=fp8"], GOOD, 'unknown precision "fp8"'),
    (["--dataset", "torch/cifar10", "--data-dir", "{tmp}/nothing"], GOOD, "Dataset not found"),
    (["--dry-run", "--resources-per-trial", '{"a100": 1}'], GOOD, "more than this machine has"),
]


@pytest.mark.parametrize("args, space_text, message", CASES, ids=[c[2][:30] for c in CASES])
def test_bad_input_exits_2_with_one_line(tmp_path, args, space_text, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "started" in args or "corrupt" in args:  # a search whose record exists (the space's fingerprint, 8 steps)
        (tmp_path / "space.yaml").write_text(space_text)
        record = {
            "name": "x",
            "space_path": str(tmp_path / "space.yaml"),
            "fingerprint": load_space(tmp_path / "space.yaml").fingerprint,
            "tracking_uri": "sqlite:///x.db",
            "parent_run_id": "p",
            "settings": {"max_steps": 8},
        }
        (tmp_path / "results" / args[2]).mkdir(parents=True)
        text = json.dumps(record) if args[2] == "started" else "{"
        (tmp_path / "results" / args[2] / "vitplast_search.json").write_text(text)
    proc, seconds, storage = run_search(tmp_path, *args, space_text=space_text)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr
    assert seconds < 60
    assert ray_sessions() == set(), "a Ray session was started"
    assert not (storage / "mlflow.db").exists(), "an MLflow store was created"
    assert not any(storage.glob("*/experiment_state*")), "a Ray Tune experiment was written"


def test_help_documents_every_flag():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "search.py"), "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    for flag in (
        "--space",
        "--num-samples",
        "--max-steps",
        "--name",
        "--storage",
        "--tracking-uri",
        "--address",
        "--cpus-per-trial",
        "--gpus-per-trial",
        "--max-concurrent",
        "--seed",
        "--model",
        "--dataset",
        "--data-dir",
    ):
        assert flag in proc.stdout
    assert "(default: None)" not in proc.stdout


def test_dry_run_plans_and_estimates_without_starting_anything(tmp_path):
    """--dry-run validates as a search does, prints the trials, resources, concurrency and an estimate from steps
    timed here, and exits 0: no Ray session, no MLflow store, no search record."""
    flags = [
        "--dry-run",
        "--name",
        "planned",
        "--set",
        "weight_decay=0.05",
        "--set",
        "blocks=2,3",
        "--precision",
        "fp32",
    ]
    proc, seconds, storage = run_search(tmp_path, *flags, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "trials:     2, optuna (seed 0), ASHA early stopping" in out
    assert "components: any non-empty subset of emb, ln1, mha, ln2, fc1, fc2 (63)" in out
    assert "weight decay 0.05" in out and "precision fp32" in out  # the --set and --precision values
    assert "resources:  {CPU: 1} per trial; this machine:" in out and "at once:    2 trial(s)" in out
    assert re.search(r"all \(fp32\): \d+ ms/step \(median of \d\)", out), out
    assert re.search(r"estimate:   (about )?\d+ s", out) and "caveats:" in out, out
    print(f"dry run: {seconds:.1f} s here (the goal, under 30 s, is judged on a quiet machine)")
    assert ray_sessions() == set(), "a Ray session was started"
    assert not (storage / "mlflow.db").exists() and not (storage / "planned").exists()
