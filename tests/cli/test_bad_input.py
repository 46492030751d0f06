"""Bad input to every command: one clear line on stderr, exit code 2, before any work starts (no Ray session, no
MLflow store, no training, no measurement).

The table runs each case in this process (the command's entry function with its argv: fast); a few cases run the
real entry points as subprocesses (``scripts/search.py``, ``python -m vitplast_tune``, ``vitplast-search``).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _commands import ray_sessions, refused
from _families import hf_folder

from vitplast_tune import cli
from vitplast_tune.config import TESTBED_WEIGHTS
from vitplast_tune.space import load_space

ROOT = Path(__file__).resolve().parents[2]
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
FIFO = GOOD.replace("scheduler: asha", "scheduler: fifo")
NO_GPU = not torch.cuda.is_available()
TESTBED = str(TESTBED_WEIGHTS)
PREREG = ("--preregistration", str(ROOT / "docs" / "results" / "data" / "lab-v2" / "preregistration.yaml"))


def edit(old: str, new: str, base: str = GOOD) -> str:
    assert old in base, old
    return base.replace(old, new)


# (arguments, space file text, what the one line says); {tmp} is the test's folder, the space is {tmp}/space.yaml
SEARCH = [
    ([], edit("mode: max", "mode: [max"), "malformed YAML"),
    ([], edit("mode: max", "mode: max  # caf\udce9"), "(0xe9) is not UTF-8; save the space file as UTF-8 text"),
    ([], edit("num_samples", "num_sample"), 'did you mean "num_samples"'),
    (["--data-dir", "{tmp}"], GOOD, '--data-dir does not apply to dataset "digits" and "fractals", shipped or'),
    (["--download"], GOOD, '--download does not apply to dataset "digits" and "fractals"'),
    (
        ["--experiment", "e" * 501],
        GOOD,
        "--experiment is 501 characters long; MLflow takes experiment names of at most 500",
    ),
    (["--set", "image_cache=64"], GOOD, 'image_cache 64 does not apply to dataset "digits", held decoded in memory'),
    ([], edit("{subsets: any}", "[mha, mlp]"), 'unknown component "mlp"'),
    ([], edit("{subsets: any}", "[]"), "empty or malformed component subset"),
    ([], edit("[1.0e-3, 1.0]", "[0, 1.0]"), "loguniform range must be positive"),
    ([], edit("[1.0e-3, 1.0]", "[1.0, 1.0e-3]"), "empty or inverted"),
    ([], edit("lr: {loguniform: [1.0e-3, 1.0]}", "lr: -0.1"), "lr must be positive"),
    ([], edit("algorithm: optuna", "algorithm: bayes"), 'unknown algorithm "bayes"'),
    ([], edit("scheduler: asha", "scheduler: pbt"), 'unknown scheduler "pbt"'),
    (
        [],
        edit("num_samples", "sampler: bayes\nnum_samples"),
        'unknown sampler "bayes" (did you mean "cmaes"?); use one of tpe, tpe-multivariate, gp, cmaes, random, qmc',
    ),
    (
        [],
        edit("num_samples", "sampler: cmaes\nnum_samples"),
        "sampler cmaes needs numbers, and components is a category",
    ),
    ([], edit("metric: val_acc", "metric: accuracy"), 'metric "accuracy" is not reported by trials'),
    ([], edit("mode: max", "mode: min"), 'mode "min" would search for the worst val_acc'),
    (["--objective", "pareto"], GOOD, "--objective pareto needs every trial trained to its budget, but space.yaml"),
    (["--objective", "pareto"], FIFO.replace("optuna", "random"), "--objective pareto needs algorithm: optuna"),
    (["--objective", "cheap"], GOOD, "argument --objective: invalid choice: 'cheap'"),
    (["--model", "vit_bace_patch16_224"], GOOD, 'unknown timm model "vit_bace_patch16_224"'),
    (["--dataset", "cifar10", "--data-dir", "{tmp}/nothing"], GOOD, 'dataset "cifar10" not found'),
    (["--dataset", "imagefolder", "--data-dir", "{tmp}/nothing"], GOOD, "image folder"),
    (["--weights", "{tmp}/nope.safetensors"], GOOD, "nope.safetensors does not exist"),
    (["--augment", "paprr"], GOOD, 'unknown augmentation "paprr" (did you mean "paper"?)'),
    (["--model", "convnext_atto"], GOOD, '"convnext_atto" is a ConvNeXt, of no supported model family; supported:'),
    (["--model", "hf:{tmp}/nothing"], GOOD, "nothing has no config.json"),
    (["--model", "hf:{tmp}/hf-vit", "--set", "drop_path=0.1"], GOOD, "hf-vit models have no stochastic depth"),
    (["--set", "auto_augment=randd-m9"], GOOD, 'unknown auto_augment policy "randd-m9" (did you mean "rand"?)'),
    (["--set", "auto_augment=rand-zz9"], GOOD, 'auto_augment "rand-zz9" is not a policy timm understands'),
    (["--set", "mixup=0.8", "--set", "batch_size=7"], GOOD, "batch_size must be even, got 7"),
    (["--gpus-per-trial", "2.5"], GOOD, "each data-parallel worker trains on one GPU"),
    (["--workers-per-trial", "2", "--gpus-per-trial", "1"], GOOD, "--workers-per-trial 2 needs a whole GPU each"),
    (["--weights", "{tmp}/space.yaml"], GOOD, "space.yaml is unreadable or corrupt"),
    (["--cpus-per-trial", "-1"], GOOD, "must not be negative"),
    (["--max-steps", "0"], GOOD, "max_steps must be positive"),
    (["--max-steps", "1.5"], GOOD, "--max-steps: invalid int value"),
    (["--seed", "forty-two"], GOOD, "--seed: invalid int value"),
    (["--resources-per-trial", "{a100: 1}"], GOOD, "--resources-per-trial: invalid loads value"),
    (["--storage", "/proc/vitplast"], GOOD, "not writable"),
    (["--storage", "{tmp}/a-file"], GOOD, "--storage {tmp}/a-file is a file"),
    (["--storage", "{tmp}/a-file/under"], GOOD, "lies under {tmp}/a-file, which is a file"),
    (["--resume", "--name", "never-ran"], GOOD, 'no search "never-ran" to resume in'),
    (["--resume", "--name", "started", "--max-steps", "16"], GOOD, "--max-steps 16 differs from the 8"),
    (["--resume", "--name", "corrupt"], GOOD, "is unreadable"),
    # trial settings of the wrong type, from the space's defaults, a searched parameter or a flag
    ([], edit("max_steps: 8}", "max_steps: 8, seed: forty-two}"), "seed must be an integer, got 'forty-two'"),
    ([], edit("max_steps: 8}", "max_steps: 8, seed: 1.5}"), "seed must be an integer, got 1.5"),
    ([], edit("max_steps: 8}", "max_steps: 8, seed: -1}"), "seed must not be negative"),
    ([], edit("{loguniform: [1.0e-3, 1.0]}", '"0.1"'), "lr must be a finite number, got '0.1' (a string)"),
    ([], edit("{loguniform: [1.0e-3, 1.0]}", "true"), "lr must be a finite number, got True (a boolean)"),
    ([], edit("{loguniform: [1.0e-3, 1.0]}", "{choice: [0.1, fast]}"), "lr must be a finite number, got 'fast'"),
    ([], edit("  lr:", "  seed: {choice: [0, x]}\n  lr:"), "seed must be an integer, got 'x'"),
    ([], edit("  lr:", "  seed: {uniform: [0, 9]}\n  lr:"), "seed must be an integer, got 0.0"),
    ([], edit("  lr:", "  batch_size: {choice: [32, 1.5]}\n  lr:"), "batch_size must be an integer, got 1.5"),
    ([], edit("max_steps: 8}", "max_steps: 8, grad_checkpointing: 1}"), "grad_checkpointing must be true or false"),
    ([], edit("max_steps: 8}", "max_steps: 8, blocks: [0, last]}"), "blocks must be a list of integers"),
    ([], edit("max_steps: 8}", "max_steps: 8, optimizer: adam}"), 'did you mean "adamw"'),
    # searches that could not produce a result
    ([], GOOD + "max_trainable_params: 100\n", "no trial fits the parameter budget max_trainable_params 100"),
    (["--dataset", "imagefolder", "--data-dir", "{tmp}/one-class"], GOOD, "has 1 class folder(s) (cat)"),
    (["--resources-per-trial", '{"a100": 1}'], GOOD, "more than this machine has for a local Ray instance"),
    (["--cpus-per-trial", "4096"], GOOD, "a trial asks for {CPU: 4096}, more than this machine has"),
    # names and the rest of the search
    (["--name", "n" * 300], GOOD, "--name is 300 characters long; at most"),
    (["--name", "n" * 250], GOOD, "--name is 250 characters long; at most 218 fit"),
    (["--name", "my search"], GOOD, '--name "my search" must be a plain name'),
    (["--name", "../elsewhere"], GOOD, "must be a plain name"),
    (["--plasticity-pairs", "-5"], GOOD, "--plasticity-pairs must be at least 1, got -5"),
    (["--plasticity-pairs", "0"], GOOD, "--plasticity-pairs must be at least 1, got 0"),
    (["--dataset", "fractals"], GOOD, '--plasticity-reference is "fractals", the dataset itself'),
    (["--connect-timeout", "0"], GOOD, "--connect-timeout must be positive"),
    ([], edit("metric: val_acc\nmode: max", "metric: [val_acc, val_acc]\nmode: [max, max]", FIFO), "objective twice"),
    ([], edit("{subsets: any}", "[all, mha]") + "warm_start: 1\n", "warm_start needs algorithm: optuna and comp"),
    ([], GOOD + "warm_start: 5\n", "warm_start 5 is more than the search's 2 trial(s)"),
    (["--num-samples", "1"], GOOD + "warm_start: 2\n", "warm_start 2 is more than the search's 1 trial(s)"),
    (["--set", "lr=fast"], GOOD, "--set lr=fast: lr takes a number, not 'fast'"),
    (["--set", "max_stesp=9"], GOOD, 'unknown setting "max_stesp" (did you mean "max_steps"?)'),
    (["--set", "blocks=a,b"], GOOD, "blocks takes a list of integers such as 0,1,2 or none"),
    (["--set", "compile=maybe"], GOOD, "compile takes true or false"),
    (["--max-steps", "8", "--set", "max_steps=9"], GOOD, "--set max_steps=9 contradicts --max-steps 8"),
    (["--set", "precision=fp8"], GOOD, 'unknown precision "fp8"'),
    (["--dataset", "torch/cifar10", "--data-dir", "{tmp}/nothing"], GOOD, "Dataset not found"),
    (["--dry-run", "--resources-per-trial", '{"a100": 1}'], GOOD, "more than this machine has"),
    # every setting checked the same way whichever door it comes in by, against the model it will meet (4 blocks)
    (["--set", "components=mha+fc9"], GOOD, 'unknown component "fc9"'),  # the space searches components
    ([], edit("max_steps: 8}", "max_steps: 8, depth: 9-12}"), 'depth "9-12" is out of range: the model has 4 blocks'),
    ([], edit("  lr:", "  depth: {choice: [all, 9-12]}\n  lr:"), 'depth "9-12" is out of range: the model has 4'),
    (["--set", "depth=2-7", "--dry-run"], FIFO.replace("{subsets: any}", "[mha]"), 'depth "2-7" is out of range'),
    (
        [],
        edit("max_steps: 8}", "max_steps: 8, blocks: [0, 7]}"),
        "block 7 is beyond vit_testbed_patch8_32, which has 4",
    ),
    (["--set", "lora_rank=100000"], edit("{subsets: any}", '["mha:lora"]'), "lora_rank 100000 is above the width"),
    (["--model", "hf:{tmp}/hf-vit", "--set", "depth=2-3"], GOOD, 'depth "2-3" is out of range: the model has 2 blocks'),
    (["--model", "hf:{tmp}/hf-vit", "--set", "lora_rank=33"], edit("{subsets: any}", '["fc2:lora"]'), "(32 at "),
    # every setting a trial needs, checked against the model, its weights, the recipe and the workers before Ray
    (["--model", "deit_testbed_distilled_patch8_32", "--weights", TESTBED], GOOD, 'does not fit "deit_testbed_dis'),
    (["--model", "hf:{tmp}/hf-vit", "--set", "pretrained=true"], GOOD, "hf-vit has no weights (model.safetensors"),
    (["--set", "auto_augment=rand-m9-mstd0.5", "--augment", "none"], GOOD, "needs a training crop: augment paper"),
    (["--workers-per-trial", "2", "--cpus-per-trial", "2", "--batch-size", "15"], GOOD, "15 does not divide among"),
    (
        ["--workers-per-trial", "2", "--cpus-per-trial", "2", "--batch-size", "14", "--set", "cutmix=1.0"],
        GOOD,
        "batch_size 14 over 2 workers gives 7 each, an odd number; give a multiple of 4",
    ),
    (  # a batch size and cutmix that fail only together, each drawn by the space
        ["--workers-per-trial", "2", "--cpus-per-trial", "2"],
        edit("  lr:", "  batch_size: {choice: [16, 14]}\n  cutmix: {choice: [0.0, 1.0]}\n  lr:"),
        "batch_size 14 (drawn by space.yaml) over 2 workers gives 7 each",
    ),
    (["--resume", "--name", "deep"], GOOD, 'depth "9-12" is out of range: the model has 4 blocks'),
    (
        ["--resume", "--name", "typed"],
        GOOD,
        "lr must be a finite number, got 'fast' (a string) (in the settings recorded",
    ),
]
if NO_GPU:
    SEARCH.append((["--gpus-per-trial", "1"], GOOD, "a trial asks for {CPU: 1, GPU: 1}, more than this machine has"))

# (command, arguments, what the one line says)
OTHERS = [
    ("analyze", [], "the following arguments are required: --name"),
    ("analyze", ["--name", "never-ran", "--storage", "{tmp}/results"], 'no search "never-ran" recorded in'),
    ("analyze", ["--name", "started", "--storage", "{tmp}/results"], "has not finished: no trial table"),
    ("analyze", ["--name", "started", "--storage", "{tmp}/a-file"], "--storage {tmp}/a-file is a file"),
    ("analyze", ["--name", "started", "--name", "started"], "--name started is given 2 times; name each search once"),
    ("analyze", ["--name", "a", "--name", "b", "--out", "{tmp}/a-file"], "--out {tmp}/a-file is a file"),
    ("plasticity", ["--device", "quantum"], 'invalid device "quantum"'),
    ("plasticity", ["--out", "{tmp}/a-file"], "--out {tmp}/a-file is a file"),
    ("plasticity", ["--out", "{tmp}/a-file/sub"], "lies under {tmp}/a-file, which is a file"),
    ("plasticity", ["--batch-size", "0"], "--batch-size: must be a positive integer, not 0"),
    ("plasticity", ["--max-pairs", "-3"], "--max-pairs: must be a positive integer, not -3"),
    ("plasticity", ["--variant", "papr"], "--variant: invalid choice: 'papr'"),
    ("plasticity", ["--data-dir", "{tmp}"], '--data-dir does not apply to dataset "digits" and "fractals"'),
    ("pretrain", ["--out", "{tmp}"], "--out {tmp} is a folder"),
    ("pretrain", ["--out", "{tmp}/a-file/model.safetensors"], "lies under {tmp}/a-file, which is a file"),
    ("pretrain", ["--out", "{tmp}/model.pt"], "must end in .safetensors"),
    ("pretrain", ["--out", "{tmp}/old.safetensors"], "old.safetensors exists; pass --overwrite"),
    ("pretrain", [], "vit_testbed_patch8_32.fractal.safetensors exists; pass --overwrite"),  # the shipped weights
    ("pretrain", ["--out", "{tmp}/new.safetensors", "--steps", "0"], "--steps must be at least 1, got 0"),
    ("pretrain", ["--out", "{tmp}/new.safetensors", "--num-classes", "0"], "--num-classes must be at least 2"),
    ("pretrain", ["--out", "{tmp}/new.safetensors", "--batch-size", "-8"], "--batch-size must be at least 1"),
    ("pretrain", ["--out", "{tmp}/new.safetensors", "--threads", "0"], "--threads must be at least 1, got 0"),
    ("pretrain", ["--out", "{tmp}/new.safetensors", "--lr", "-0.001"], "--lr must be positive, got -0.001"),
    ("pretrain", ["--out", "{tmp}/new.safetensors", "--lr", "fast"], "--lr: invalid float value: 'fast'"),
    ("pretrain", ["--out", "{tmp}/new.safetensors", "--images-per-class", "1"], "is larger than the 64 training"),
    ("recommend", ["--storage", "{tmp}/a-file"], "--storage {tmp}/a-file is a file"),
    ("recommend", ["--storage", "{tmp}/a-file", "--verify", "2"], "--storage {tmp}/a-file is a file"),
    ("recommend", ["--verify", "-1"], "--verify must not be negative"),
    ("recommend", ["--top", "0"], "--top: must be a positive integer, not 0"),
    ("recommend", ["--plasticity-pairs", "0"], "--plasticity-pairs: must be a positive integer"),
    ("recommend", ["--budget-params", "0"], "--budget-params: must be a positive integer"),
    ("recommend", ["--weights", "{tmp}/nope.safetensors"], "nope.safetensors does not exist"),
    ("recommend", ["--data-dir", "{tmp}"], '--data-dir does not apply to dataset "digits"'),
    ("lab", ["run", "digit"], 'unknown task "digit" (did you mean "digits"?); tasks: digits, digits_c-contrast'),
    ("lab", ["run", "digits", "--model", "s9"], 'unknown model "s9"; models: s0'),
    ("lab", ["run", "digits", "fractals_novel"], "run takes one task"),
    ("lab", ["check", "--max-rounds", "-1"], "--max-rounds must not be negative"),
    ("lab", ["check", "--storage", "{tmp}/a-file"], "--storage {tmp}/a-file is a file"),
    ("lab", ["pooled", "lab.s0.digits"], "pooled needs --name NAME"),
    (
        "lab",
        ["pooled", "--name", "p", "lab.s0.digits", "--storage", "{tmp}"],
        "{tmp}/lab.s0.digits is not a kept lab: it has no lab.json",
    ),
    ("lab", ["analyze", "--from", "{tmp}/nowhere"], "--from: no folder {tmp}/nowhere"),
    ("lab", ["pooled", "--from", "{tmp}"], "pooled --from needs --out DIR"),
    ("lab", ["check", "--from", "{tmp}"], "--from goes with analyze (one folder) or pooled"),
    ("lab", ["analyze", "--from", "{tmp}", "--design", "{tmp}/none.yaml"], "{tmp} is not a kept lab"),
    ("lab", ["walk"], "argument command: invalid choice: 'walk'"),
    ("lab", ["registered", "--storage", "{tmp}/labs"], "registered needs --preregistration FILE and --storage DIR"),
    ("lab", ["registered", *PREREG, "--storage", "{tmp}/labs", "--model", "s1"], "registered takes no tasks"),
    ("lab", ["registered", *PREREG, "--storage", "{tmp}/labs", "--max-rounds", "1"], "registered takes no tasks"),
    (
        "lab",
        ["registered", "--preregistration", "{tmp}/nope.yaml", "--storage", "{tmp}/labs"],
        "pre-registration {tmp}/nope.yaml not found",
    ),
    ("lab", ["registered", *PREREG, "--storage", "{tmp}/labs", "--resume"], "holds no registered run to continue"),
    ("lab", ["progress", "--storage", "{tmp}"], "progress needs --storage DIR holding a registered run"),
]
if NO_GPU:
    OTHERS.append(("plasticity", ["--device", "cuda"], 'device "cuda": no CUDA GPU is visible here'))


@pytest.fixture
def world(tmp_path, monkeypatch):
    """The test's folder with the files the cases name; any command that gets past its checks fails the test."""
    (tmp_path / "space.yaml").write_text(GOOD)
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "old.safetensors").write_bytes(b"weights")
    (tmp_path / "one-class" / "train" / "cat").mkdir(parents=True)
    hf_folder(tmp_path, "hf-vit")  # a tiny transformers ViT's config
    recorded = {"deep": {"max_steps": 8, "depth": "9-12"}, "typed": {"max_steps": 8, "lr": "fast"}}
    for name, text in (("started", None), ("corrupt", "{"), ("deep", None), ("typed", None)):
        folder = tmp_path / "results" / name
        folder.mkdir(parents=True)
        record = {
            "name": name,
            "space_path": str(tmp_path / "space.yaml"),
            "fingerprint": load_space(tmp_path / "space.yaml").fingerprint,
            "tracking_uri": f"sqlite:///{tmp_path}/elsewhere.db",
            "parent_run_id": "p",
            "settings": recorded.get(name, {"max_steps": 8}),
        }
        (folder / "vitplast_search.json").write_text(text or json.dumps(record))

    def work(*args, **kwargs):
        raise AssertionError("the command started working: its input was not refused")

    from vitplast_tune.plan import resources as resources_module
    from vitplast_tune.predictors import report
    from vitplast_tune.recommend import ranking
    from vitplast_tune.run import driver as driver_module
    from vitplast_tune.vit import pretraining

    monkeypatch.setattr(driver_module, "execute", work)  # the search itself: Ray, MLflow, trials
    # Each case stands for a fresh command-line process, which has no Ray instance of its own yet (the session's
    # ray_local fixture may have started one in this process).
    monkeypatch.setattr(resources_module, "ray_running_here", lambda: False)
    monkeypatch.setattr(pretraining, "pretrain_testbed", work)
    monkeypatch.setattr(report, "plasticity_report", work)
    monkeypatch.setattr(ranking, "recommend", work)
    return tmp_path


@pytest.mark.parametrize("args, space_text, message", SEARCH, ids=[c[2][:40] for c in SEARCH])
def test_search_refuses_bad_input(world, capsys, args, space_text, message):
    (world / "space.yaml").write_bytes(space_text.encode("utf-8", "surrogateescape"))  # \udce9: the byte 0xe9
    storage = world / "results"
    line = refused("search", ["--space", str(world / "space.yaml"), "--storage", str(storage), *args], world, capsys)
    assert message.replace("{tmp}", str(world)) in line
    assert not (storage / "mlflow.db").exists(), "an MLflow store was created"
    assert not any(storage.glob("*/experiment_state*")), "a Ray Tune experiment was written"


@pytest.mark.parametrize("command, args, message", OTHERS, ids=[f"{c[0]}: {c[2][:40]}" for c in OTHERS])
def test_every_command_refuses_bad_input(world, capsys, command, args, message):
    line = refused(command, args, world, capsys)
    assert message.replace("{tmp}", str(world)) in line


def test_unknown_component_all_is_never_said_while_all_is_valid(world, capsys):
    """ "all" and "head" join other names as a union ("all+mha" is all, "head+mha" is mha); an unknown name is
    refused with the valid ones."""
    from vitplast_tune.components import COMPONENTS, parse_subset

    assert parse_subset("all+mha") == COMPONENTS and parse_subset(["head", "fc1"]) == ("fc1",)
    (world / "space.yaml").write_text(edit("{subsets: any}", "{choice: [[all, mha], head+fc2, mlp]}"))
    line = refused("search", ["--space", str(world / "space.yaml"), "--storage", str(world / "r")], world, capsys)
    assert 'unknown component "mlp"' in line and '"all" (every one)' in line


# ----------------------------------------------------------------------------- the real entry points


def run(*cmd: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a command; the timeout only catches a hang (timings belong to benchmarks)."""
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip().startswith("error:")]  # notes may come first
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_search_script_refuses_a_bad_space_quickly(tmp_path):
    (tmp_path / "space.yaml").write_text(edit("num_samples", "num_sample"))
    proc = run(sys.executable, str(ROOT / "scripts" / "search.py"), "--space", str(tmp_path / "space.yaml"))
    assert 'did you mean "num_samples"' in one_error_line(proc)
    assert ray_sessions() == set()


@pytest.mark.slow  # a child process or a server of its own
def test_search_refuses_wrong_types_in_a_child_process_check(tmp_path):
    """The command line checks model and data in a child process (no torch in the driver): errors come back."""
    (tmp_path / "space.yaml").write_text(GOOD + "max_trainable_params: 100\n")
    proc = run(sys.executable, "-m", "vitplast_tune", "search", "--space", str(tmp_path / "space.yaml"))
    assert "no trial fits the parameter budget max_trainable_params 100" in one_error_line(proc)
    assert ray_sessions() == set()


@pytest.mark.slow  # a child process or a server of its own
def test_address_with_nothing_listening_fails_within_the_timeout(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    (tmp_path / "space.yaml").write_text(GOOD)
    args = ["--space", str(tmp_path / "space.yaml"), "--no-plasticity", "--storage", str(tmp_path / "results")]
    command = [sys.executable, "-m", "vitplast_tune", "search", *args]
    proc = run(*command, "--address", f"127.0.0.1:{port}", "--connect-timeout", "3")  # hung for ever before
    line = one_error_line(proc)
    assert f"nothing answered at 127.0.0.1:{port} within 3 s (Connection refused)" in line
    assert "check that its head is up" in line
    assert ray_sessions() == set()


@pytest.mark.slow  # a child process or a server of its own
def test_a_postgresql_store_that_takes_the_connection_and_never_answers_is_refused_before_ray(tmp_path):
    (tmp_path / "space.yaml").write_text(GOOD)
    args = ["--space", str(tmp_path / "space.yaml"), "--no-plasticity", "--storage", str(tmp_path / "results")]
    with socket.socket() as silent:  # takes the connection (the kernel's backlog), never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        uri = f"postgresql://mlflow@127.0.0.1:{port}/mlflow"
        command = [sys.executable, "-m", "vitplast_tune", "search", *args, "--tracking-uri", uri]
        proc = run(*command, "--connect-timeout", "2")  # hung silently in the search before
    assert one_error_line(proc) == (
        f"error: the postgresql server of MLflow's store 127.0.0.1:{port} (from --tracking-uri) did not answer "
        "within 2 s (timed out): check that it runs and the URI's host and port"
    )
    assert ray_sessions() == set() and not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "argv, code, text",
    [
        ([], 2, "usage: vitplast [-h] [--version] COMMAND ..."),
        (["serch"], 2, "error: vitplast: argument COMMAND: invalid choice: 'serch' (choose from 'search', "),
        (["--help"], 0, "usage: vitplast [-h] [--version] COMMAND ..."),
        (["pretrain", "--steps", "0", "--out", "{tmp}/x.safetensors"], 2, "error: --steps must be at least 1, got 0"),
    ],
)
def test_python_m_vitplast_tune(tmp_path, argv, code, text):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = run(sys.executable, "-m", "vitplast_tune", *argv)
    assert proc.returncode == code and text in proc.stdout + proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    if code == 2 and argv:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # a mistake is one line


def test_vitplast_help_lists_each_command_with_its_sentence():
    from vitplast_tune.cli import _MODULES, COMMANDS

    proc = run(sys.executable, "-m", "vitplast_tune", "--help")
    text = " ".join(proc.stdout.split())  # argparse wraps the sentences
    assert proc.returncode == 0 and set(COMMANDS) == {
        "search",
        "analyze",
        "plasticity",
        "pretrain",
        "recommend",
        "ui",
        "lab",
        "list",
        "status",
    }
    for name, module in _MODULES.items():
        assert f"{name} {module.HELP}" in text, name


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
        "--experiment",
        "--address",
        "--connect-timeout",
        "--cpus-per-trial",
        "--gpus-per-trial",
        "--max-concurrent",
        "--seed",
        "--model",
        "--dataset",
        "--data-dir",
        "--augment",
    ):
        assert flag in proc.stdout
    assert "(default: None)" not in proc.stdout


def vitplast_ui(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vitplast_tune", "ui", *args], capture_output=True, text=True, timeout=60
    )


def test_the_ui_of_a_search_that_does_not_exist_is_one_line(tmp_path):
    proc = vitplast_ui("never-ran", "--storage", str(tmp_path / "results"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f'error: no search "never-ran" recorded in {tmp_path / "results"}; check its name and --storage'
    ]


def test_the_ui_on_a_port_in_use_says_which_flag_to_change(tmp_path):
    import socket

    record = {"name": "s", "space_path": "x", "fingerprint": "f", "parent_run_id": "p", "settings": {}}
    (tmp_path / "results" / "s").mkdir(parents=True)
    record["tracking_uri"] = f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    (tmp_path / "results" / "s" / "vitplast_search.json").write_text(json.dumps(record))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = vitplast_ui("s", "--storage", str(tmp_path / "results"), "--port", str(port))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use (another MLflow UI?); pass --port N"
    ]


def run_search(tmp_path, *args, timeout=120):
    """``scripts/search.py`` on the test's GOOD space, storage under the test's folder: (process, seconds, storage)."""
    space, storage = tmp_path / "space.yaml", tmp_path / "results"
    space.write_text(GOOD)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "search.py"), "--space", str(space), "--storage", str(storage), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    return proc, time.perf_counter() - started, storage


@pytest.mark.slow  # a child process or a server of its own
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


def test_the_commands_that_read_records_name_the_damaged_file_and_what_to_do(tmp_path, capsys):
    """A trial table cut short (analyze, status; list says it on that search's line) and a corrupt MLflow store (ui):
    one line naming the file, what is wrong and what to do; no traceback, no Ray."""
    storage, store = tmp_path / "results", tmp_path / "mlflow.db"
    folder = storage / "cut"
    folder.mkdir(parents=True)
    (tmp_path / "space.yaml").write_text(GOOD)
    record = {
        "name": "cut",
        "space_path": str(tmp_path / "space.yaml"),
        "fingerprint": load_space(tmp_path / "space.yaml").fingerprint,
        "tracking_uri": f"sqlite:///{store}",
        "parent_run_id": "p",
        "settings": {"max_steps": 8},
    }
    (folder / "vitplast_search.json").write_text(json.dumps(record))
    (folder / "trials.csv").write_text("trial_id,components,best_val_acc,diverged\na0,mha,0.5,False\na1,fc1,0.6,Fa")
    for command, args in (
        ("analyze", ["--name", "cut", "--storage", str(storage)]),
        ("status", ["cut", "--storage", str(storage)]),
    ):
        line = refused(command, args, tmp_path, capsys)
        assert f"the trial table {folder / 'trials.csv'} is damaged (cut short: its last line is not whole)" in line
        assert "run the search again with --resume" in line
    with pytest.raises(SystemExit) as exited:  # list: that search's line says it, the others are listed
        cli.COMMANDS["list"](["--storage", str(storage)])
    (line,) = capsys.readouterr().out.splitlines()
    assert exited.value.code == 0 and line.startswith("cut  unreadable: the trial table")
    assert "is damaged (cut short: its last line is not whole)" in line
    (folder / "trials.csv").write_text("trial_id,components,best_val_acc,diverged\na0,mha,0.5\n")
    assert "line 2 has 3 fields, the header 4" in refused(
        "status", ["cut", "--storage", str(storage)], tmp_path, capsys
    )

    store.write_bytes(b"SQLite format 3\x00" + bytes(84) + b"not pages")
    line = refused("ui", ["cut", "--storage", str(storage), "--port", "5799"], tmp_path, capsys)
    assert f"the MLflow store {store} (from the search's record cut/vitplast_search.json) is corrupt" in line


def test_a_hub_id_offline_is_refused_at_once_in_one_line(world, capsys, monkeypatch):
    """An ``hf:`` hub id not in the cache with the hub off (HF_HUB_OFFLINE), or with its host unreachable (a resolver
    that fails: no address is ever asked), is one line before any retry; nothing reaches the network."""
    import socket

    from huggingface_hub import constants

    def no_resolver(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_resolver)  # whatever happens, no address is looked up
    argv = ["--space", str(world / "space.yaml"), "--storage", str(world / "results"), "--model", "hf:nobody/no-vit"]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    line = refused("search", argv, world, capsys)
    assert 'model "hf:nobody/no-vit" is not in the Hugging Face cache and the hub is off (HF_HUB_OFFLINE)' in line
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    line = refused("search", argv, world, capsys)
    assert 'model "hf:nobody/no-vit": the Hugging Face hub huggingface.co cannot be reached' in line


def test_a_timm_model_whose_weights_are_on_the_hub_is_refused_offline_in_seconds(world, capsys, monkeypatch):
    """A timm tag whose weights are on the hub (``vit_base_patch16_224``) and not in the cache, with the hub off
    (HF_HUB_OFFLINE) or not answering: one line naming --weights and the cache, before Ray, the dry run too, in
    seconds (no download's retries); the same weights in the cache pass."""
    from huggingface_hub import constants

    from vitplast_tune.vit import models

    cache = world / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))  # children read the variable, this process huggingface_hub's
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["--space", str(world / "space.yaml"), "--storage", str(world / "results"), "--model"]
    argv += ["vit_base_patch16_224", "--set", "pretrained=true"]
    hub_id = "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"
    for extra in ([], ["--dry-run"]):
        started = time.perf_counter()
        line = refused("search", argv + extra, world, capsys)
        assert time.perf_counter() - started < 10, "the hub was asked for longer than its timeout"
        assert f'the weights of "vit_base_patch16_224" ({hub_id}) are not in the Hugging Face cache {cache}' in line
        assert "the hub is off (HF_HUB_OFFLINE)" in line and "pass --weights PATH" in line
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as closed:  # bound, never listening: a host that refuses the connection
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}")
        line = refused("search", argv + ["--dry-run"], world, capsys)
        assert "and the hub 127.0.0.1 cannot be reached (Connection refused); with no network, pass --weights" in line
        snapshot = cache / f"models--{hub_id.replace('/', '--')}" / "snapshots" / "0123abc"
        snapshot.mkdir(parents=True)
        (snapshot / "model.safetensors").write_bytes(b"cached")
        (snapshot.parents[1] / "refs").mkdir()
        (snapshot.parents[1] / "refs" / "main").write_text("0123abc")
        models.check_weights("vit_base_patch16_224", None, pretrained=True)  # cached: the hub is not asked


def test_list_says_a_damaged_record_in_one_line_and_still_lists_the_others(world, capsys):
    """One search's record is not JSON: its line says so and names the file; every other search is listed; the MLflow
    store a record names, gone, is not made anew by the read; a tracking server that is down is given up in seconds
    (MLflow's own retries take a minute)."""
    from vitplast_tune import cli

    record = json.loads((world / "results" / "started" / "vitplast_search.json").read_text())
    (world / "results" / "remote").mkdir()
    with socket.socket() as down:  # bound, never listening: a server that is down
        down.bind(("127.0.0.1", 0))
        record["tracking_uri"] = f"http://127.0.0.1:{down.getsockname()[1]}"
        (world / "results" / "remote" / "vitplast_search.json").write_text(json.dumps(record))
        started = time.perf_counter()
        with pytest.raises(SystemExit) as exited:
            cli.COMMANDS["list"](["--storage", str(world / "results")])
        assert time.perf_counter() - started < 10
    lines = capsys.readouterr().out.splitlines()
    names = ["corrupt", "deep", "remote", "started", "typed"]
    assert exited.value.code == 0 and [line.split()[0] for line in lines] == names
    assert lines[0].startswith("corrupt  unreadable: ") and "corrupt/vitplast_search.json" in lines[0]
    assert lines[2:4] == ["remote  stopped  0/2 trials", "started  stopped  0/2 trials"]
    assert not (world / "elsewhere.db").exists(), "a read made an MLflow store"


def test_reading_a_search_whose_study_or_store_is_gone_says_so_and_makes_none(world):
    from vitplast_tune.errors import UserError
    from vitplast_tune.records.search import load_search

    search = load_search("started", world / "results")
    with pytest.raises(UserError, match=r'search "started" has no Optuna study in .*started/optuna.db \(missing'):
        _ = search.study
    assert not (world / "results" / "started" / "optuna.db").exists(), "a read made an Optuna study"
    with pytest.raises(UserError, match=f'the MLflow store {world / "elsewhere.db"} of search "started" is not'):
        search.runs()
    assert not (world / "elsewhere.db").exists(), "a read made an MLflow store"
