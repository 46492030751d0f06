"""The GPU check: what a search does on one GPU, asserted and timed, in under 10 minutes (ViT-B/16 at 224 px).

Every step has a timeout (together they fit 10 minutes) and ends ok, failed (with the reason) or timed out; the
check exits 1 unless every step is ok. Prints a table, writes JSON.

1. trials: two trials of the search's own trainable at ``--gpus-per-trial 0.5`` on one GPU (Ray Tune, digits), and a
   measurement task with their resources. Asserted: each ran on the GPU (the device it reports, which its MLflow run
   is tagged with), in the precision the GPU's capability gives, capped to half the GPU's memory, both at once;
   the task on the GPU too;
2. finetune: the real ``finetune`` loop (full finetuning, digits resized on the GPU): images/s, with
   ``torch.cuda.set_sync_debug_mode("warn")``: the host-device synchronisations per step and where they happen;
3. subsets: fp32 and the CUDA options (bf16 autocast, TF32, fused SGD) for full finetuning; each single component's
   and the head's speedup beside its FLOP bound (``benchmarks.training``); the peak GPU memory of each subset;
4. pipeline: the batched transform of uint8 32 px images to 224 px on the GPU, as a share of a training step;
5. checkpoint: the checkpoint a trial reports after an evaluation of full finetuning (``search.trial``), written to
   local disk and read back: bytes and seconds;
6. measurements: plasticity (paper variant, digits vs fractals) and the gradient criteria, as a search measures
   them before its trials;
7. precision: the losses of a few training steps in bf16 autocast against fp32 from the same weights;
8. compile: torch.compile's first step (the compile time) and its steps after, against eager steps;
9. ddp: the training loop in torch DDP on one GPU in bf16 (a process group of one, NCCL; gloo on the CPU) against the
   same steps without DDP (losses and images/s); and where there are 2 GPUs, a trial's Ray Train run of 2 workers over
   NCCL (``run.parallel.train_on_workers``) against the same trial on one GPU (the loss curves). With one GPU that
   half says so in one line.

    python -m benchmarks.gpu_check --json gpu_check.json
    python -m benchmarks.gpu_check --dry-run          # the plan, nothing run
    python -m benchmarks.gpu_check --cpu-dry-run      # every step on the CPU at tiny sizes (what the tests run)
    python -m benchmarks.gpu_check --steps-only trials,precision
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks import common, training
from benchmarks.common import SUBSETS
from vitplast_tune import freezing
from vitplast_tune.config import FinetuneConfig, PlasticityInputs
from vitplast_tune.data import transforms
from vitplast_tune.vit import devices as vt_devices
from vitplast_tune.vit import models
from vitplast_tune.vit import training as vt_training
from vitplast_tune.vit.families.registry import layout_of

TRIAL_COMPONENTS = ["mha", "all"]  # the two trials sharing one GPU
# Seconds each step may take on the GPU; together under 10 minutes. The CPU dry run gives each CPU_SLOWER times more.
TIMEOUTS = {
    "trials": 150,
    "finetune": 60,
    "subsets": 80,
    "pipeline": 15,
    "checkpoint": 30,
    "measurements": 90,
    "precision": 30,
    "compile": 60,
    "ddp": 60,
}
CPU_SLOWER = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--model", default="vit_base_patch16_224", help="timm ViT, randomly initialised")
    p.add_argument("--batch-size", type=common.at_least(1), default=64, help="training batch (default: 64)")
    p.add_argument("--steps", type=common.at_least(1), default=20, help="timed steps per configuration (default: 20)")
    p.add_argument("--warmup", type=common.at_least(0), default=5, help="untimed steps before them (default: 5)")
    p.add_argument(
        "--trial-steps", type=common.at_least(1), default=40, help="steps of each of the two trials (default: 40)"
    )
    p.add_argument("--pairs", type=common.at_least(1), default=1024, help="image pairs for plasticity (default: 1024)")
    p.add_argument(
        "--steps-only",
        type=common.listed(common.known(STEPS)),
        help="run only these steps, comma-separated (default: all)",
    )
    p.add_argument("--cpu-dry-run", action="store_true", help="every step on the CPU, tiny sizes, longer timeouts")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    common.add_json_flag(p, help="write the results here")
    args = p.parse_args(argv)
    args.device, args.compile_backend, args.slower = "cuda", "inductor", 1
    if args.cpu_dry_run:
        args.device, args.compile_backend, args.slower = "cpu", "aot_eager", CPU_SLOWER
        args.model, args.batch_size, args.steps, args.warmup = "vit_testbed_patch8_32", 8, 2, 1
        args.trial_steps, args.pairs = 4, 32
    return args


# ----------------------------------------------------------------------------- steps


class StepTimeout(Exception):
    """A step ran past its timeout."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise StepTimeout in this (the main) thread when the block runs longer than ``seconds``."""

    def expire(signum, frame):
        raise StepTimeout(f"ran past its {seconds:.0f} s timeout")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_step(name: str, fn: Callable[[], dict], timeout_s: float) -> dict:
    """``fn()`` within its timeout: its result with ``status`` ok, or failed / timeout with the reason."""
    started = time.perf_counter()
    try:
        with deadline(timeout_s):
            result = {"status": "ok", **fn()}
    except StepTimeout as exc:
        result = {"status": "timeout", "reason": str(exc)}
    except Exception as exc:
        traceback.print_exc()
        result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:800]}
    result["seconds"] = time.perf_counter() - started
    print(f"[{name}] {result['status']} in {result['seconds']:.1f} s", flush=True)
    return result


def step_trials(args, device: torch.device) -> dict:
    """Two trials of ``search.trial.train_trial`` sharing one GPU (0.5 each) and a measurement task; asserted."""
    from ray import tune

    from vitplast_tune.data import datasets
    from vitplast_tune.run import measuring_worker, train_trial

    gpus = 0.5 if device.type == "cuda" else 0.0
    settings = FinetuneConfig(
        model=args.model,
        pretrained=False,
        dataset="digits",
        max_steps=args.trial_steps,
        eval_every=max(args.trial_steps // 2, 1),
        batch_size=args.batch_size,
        warmup_steps=2,
        eval_test=False,
        threads=1,
    )
    decoded = datasets.decode_dataset("digits", models.pretrained_data_config(args.model))
    with common.local_ray(cpus=2, gpus=1 if gpus else 0), common.scratch("gpu_check_trials_") as tmp:
        trainable = tune.with_parameters(train_trial, settings=settings, decoded=decoded)
        trainable = tune.with_resources(trainable, {"cpu": 1, "gpu": gpus})
        grid = tune.Tuner(
            trainable,
            param_space={"components": tune.grid_search(TRIAL_COMPONENTS)},
            run_config=tune.RunConfig(name="trials", storage_path=str(tmp), verbose=0),
        ).fit()
        with measuring_worker({"cpu": 1, "gpu": gpus}) as run:
            task_device = run(vt_devices.task_device)
    trials = {r.config["components"]: _trial_facts(r) for r in grid}
    expected = {
        "device": vt_devices.device_name(torch.device("cuda", 0)) if gpus else "cpu",
        "precision": vt_devices.resolve_precision("auto", device),
        "gpu_memory_fraction": gpus or None,
    }
    checks = {f"{c} {key}": trials[c].get(key) == value for c in trials for key, value in expected.items()}
    if gpus and not hasattr(torch.cuda, "get_per_process_memory_fraction"):  # this torch cannot tell the cap
        checks.update({f"{c} gpu_memory_fraction": "not readable with this torch" for c in trials})
    checks["no trial failed"] = all(t["error"] is None for t in trials.values())
    checks["both trials at once"] = max(t["start"] for t in trials.values()) < min(t["end"] for t in trials.values())
    checks["measurement task on the same device"] = task_device == expected["device"]
    result = {"expected": expected, "trials": trials, "task_device": task_device, "checks": checks}
    failed = [name for name, ok in checks.items() if ok is False]
    if failed:
        raise AssertionError(f"not as expected: {', '.join(failed)} ({result})")
    return result


def _trial_facts(result) -> dict:
    m = result.metrics or {}
    end = float(m.get("timestamp", 0))
    return {
        "device": m.get("device"),
        "precision": m.get("precision"),
        "gpu_memory_fraction": m.get("gpu_memory_fraction"),
        "images_per_s": m.get("images_per_s"),
        "start": end - float(m.get("time_total_s", 0)),
        "end": end,
        "error": None if result.error is None else str(result.error)[:300],
    }


def step_finetune(args, device: torch.device) -> dict:
    """The real finetune loop: images/s of its second evaluation window, and the syncs it makes per step."""
    cfg = FinetuneConfig(
        model=args.model,
        pretrained=False,
        dataset="digits",
        batch_size=args.batch_size,
        max_steps=2 * (args.steps + args.warmup),
        eval_every=args.steps + args.warmup,
        warmup_steps=2,
        eval_test=False,
    )
    reports: list[dict] = []
    with sync_warnings(device) as caught:
        vt_training.finetune(cfg, report=lambda metrics, state: reports.append(metrics), device=device)
    where = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught)
    return {
        "images_per_s": reports[-1]["images_per_s"],
        "device": reports[-1]["device"],
        "precision": reports[-1]["precision"],
        "syncs": len(caught),
        "syncs_per_step": len(caught) / cfg.max_steps,
        "sync_sites": dict(where.most_common(6)),
        "sync_debug": device.type == "cuda",
    }


@contextlib.contextmanager
def sync_warnings(device: torch.device):
    """The warnings ``torch.cuda.set_sync_debug_mode("warn")`` gives in the block: one per host-device sync."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    caught[:] = [w for w in caught if "synchroniz" in str(w.message)]


def train_speed(args, device: torch.device, subset: str, options: bool, compile_: bool = False) -> dict[str, float]:
    """Training images/s of ``subset`` and its peak GPU memory (MiB; 0 on a CPU)."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = options
    model = models.create_model(args.model, 10, pretrained=False)
    freezing.freeze(model, subset, layout=layout_of(model))
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    fused = options and device.type == "cuda"
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, fused=fused or None)
    forward = torch.compile(model, backend=args.compile_backend) if compile_ else model
    size = models.data_config(model)["input_size"][-1]
    x = torch.randn(args.batch_size, 3, size, size, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)

    def step(_: int) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=options and device.type == "cuda"):
            loss = F.cross_entropy(forward(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    first = time.perf_counter()
    step(0)  # a compiled model compiles here
    common.sync(device)
    first = time.perf_counter() - first
    reset = (lambda: torch.cuda.reset_peak_memory_stats(device)) if device.type == "cuda" else None
    step_s = common.seconds_per_call(step, device, args.warmup, args.steps, after_warmup=reset)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    return {"images_per_s": args.batch_size / step_s, "step_s": step_s, "peak_mib": peak, "first_step_s": first}


def step_subsets(args, device: torch.device) -> dict:
    """Full finetuning in fp32 and with the CUDA options; each subset's speedup, FLOP bound and peak memory."""
    full = {"fp32": train_speed(args, device, "all", False), "options": train_speed(args, device, "all", True)}
    bounds = training.flop_bounds(args.model, args.batch_size, SUBSETS, cached_head=False)  # train_speed runs it all
    subsets = {"all": {**full["options"], "speedup": 1.0, "flop_bound": 1.0}}
    for subset in SUBSETS[1:]:
        speed = train_speed(args, device, subset, True)
        subsets[subset] = {
            **speed,
            "speedup": full["options"]["step_s"] / speed["step_s"],
            "flop_bound": bounds[subset],
        }
    return {"full": full, "subsets": subsets}


def step_pipeline(args, device: torch.device) -> dict:
    """Seconds to turn a batch of uint8 32 px images into normalized training images on the device, and their share
    of that plus a training step."""
    config = models.pretrained_data_config(args.model)
    raw = torch.from_numpy(np.random.default_rng(0).integers(0, 255, (args.batch_size, 3, 32, 32), dtype=np.uint8))
    run = lambda seed: transforms.batch_transform(raw.to(device, non_blocking=True), config, True, seed)
    transform_s = common.seconds_per_call(run, device, args.warmup, args.steps)
    step_s = train_speed(args, device, "all", True)["step_s"]
    return {"step_s": transform_s, "share_of_step": transform_s / (transform_s + step_s)}


def _full_state(args, device: torch.device) -> dict:
    """The state a full-finetuning trial checkpoints after an evaluation: weights, momentum, the best copy."""
    model = models.create_model(args.model, 10, pretrained=False).to(device)
    trainable = dict(model.named_parameters())
    optimizer = torch.optim.SGD(trainable.values(), lr=0.01, momentum=0.9)
    sum(p.sum() for p in trainable.values()).backward()
    optimizer.step()
    best = {"val_acc": 0.5, "step": 1, "trainable": {n: p.detach().clone() for n, p in trainable.items()}}
    live = {n: p.detach() for n, p in trainable.items()}
    return {"step": 1, "trainable": live, "optimizer": optimizer.state_dict(), "best": best}


def step_checkpoint(args, device: torch.device) -> dict:
    """A trial's checkpoint of full finetuning written to local disk (``search.trial.write_checkpoint``), read back."""
    from vitplast_tune.run.checkpoints import write_checkpoint
    from vitplast_tune.storage import STATE_FILE

    state = _full_state(args, device)
    common.sync(device)
    with tempfile.TemporaryDirectory(prefix="gpu_check_checkpoint_") as directory:
        started = time.perf_counter()
        write_checkpoint(Path(directory), state)
        written = time.perf_counter() - started
        size = sum(f.stat().st_size for f in Path(directory).iterdir())
        started = time.perf_counter()
        torch.load(Path(directory) / STATE_FILE, map_location=device, weights_only=True)
        common.sync(device)
        read = time.perf_counter() - started
    return {"bytes": size, "write_s": written, "read_s": read, "mib_per_s": size / 2**20 / written}


def step_measurements(args, device: torch.device) -> dict:
    """Plasticity (paper variant, digits vs fractals) and the gradient criteria, timed, on the device."""
    from vitplast_tune.vit import measure

    started = time.perf_counter()
    inputs = PlasticityInputs(args.model, None, False, "digits", "fractals", "test", None, "paper", args.pairs)
    table, _, where = measure.measure_plasticity(inputs, download=False, batch_size=args.batch_size, device=device)
    plasticity_s = time.perf_counter() - started
    cfg = FinetuneConfig(model=args.model, pretrained=False, dataset="digits", batch_size=args.batch_size)
    started = time.perf_counter()
    gradients = measure.measure_gradients(cfg, num_batches=4, device=device)
    return {
        "plasticity_s": plasticity_s,
        "plasticity_measure_s": where["seconds"],
        "pairs": int(table["n_pairs"].max()),
        "gradients_s": time.perf_counter() - started,
        "gradient_rows": len(gradients),
    }


def step_precision(args, device: torch.device, steps: int = 8) -> dict:
    """The losses of ``steps`` SGD steps from the same weights and batch: bf16 autocast against fp32 (no TF32)."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = models.create_model(args.model, 10, pretrained=False).to(device).train()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    size = models.data_config(model)["input_size"][-1]
    x = torch.randn(args.batch_size, 3, size, size, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    losses = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        model.load_state_dict(start)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        losses[name] = []
        for _ in range(steps):
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = F.cross_entropy(model(x).float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses[name].append(loss.item())
    gap = max(abs(b - f) / abs(f) for b, f in zip(losses["bf16"], losses["fp32"]))
    if gap > 0.05:
        raise AssertionError(f"bf16 losses differ from fp32 by up to {gap:.1%}: {losses}")
    return {"losses": losses, "max_relative_gap": gap}


def step_compile(args, device: torch.device) -> dict:
    """torch.compile (``--cpu-dry-run``: the aot_eager backend): the first step's seconds (compiling) and the steps
    after, against eager steps with the same CUDA options."""
    eager = train_speed(args, device, "all", True)
    compiled = train_speed(args, device, "all", True, compile_=True)
    return {
        "backend": args.compile_backend,
        "compile_s": compiled["first_step_s"] - eager["step_s"],
        "eager_images_per_s": eager["images_per_s"],
        "compiled_images_per_s": compiled["images_per_s"],
        "speedup": eager["step_s"] / compiled["step_s"],
    }


def step_ddp(args, device: torch.device, steps: int = 6) -> dict:
    """DDP in bf16 on one device against the same steps without it; NCCL between 2 GPUs where there are 2."""
    import torch.distributed as dist

    from vitplast_tune.vit import distributed

    backend = "nccl" if device.type == "cuda" else "gloo"
    port = common_port()
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = models.create_model(args.model, 10, pretrained=False).to(device).train()
        start = {k: v.clone() for k, v in model.state_dict().items()}
        size = models.data_config(model)["input_size"][-1]
        x = torch.randn(args.batch_size, 3, size, size, device=device)
        y = torch.randint(0, 10, (args.batch_size,), device=device)
        ddp = distributed.data_parallel(model, distributed.World(0, 2), device)  # the wrapper a worker trains with
        runs = {}
        for name, module in (("plain", model), ("ddp", ddp)):
            model.load_state_dict(start)
            runs[name] = _bf16_steps(module, model, x, y, steps, device)
    finally:
        dist.destroy_process_group()
    gap = max(abs(a - b) / abs(b) for a, b in zip(runs["ddp"]["losses"], runs["plain"]["losses"]))
    if gap > 1e-3:
        raise AssertionError(f"DDP's bf16 losses differ from the plain model's by up to {gap:.2%}: {runs}")
    result = {"backend": backend, "runs": runs, "max_relative_gap": gap, "two_gpus": _two_gpu_trial(args, device)}
    return result


def common_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _bf16_steps(module, model, x, y, steps: int, device: torch.device) -> dict:
    """``steps`` SGD steps of ``module`` (``model`` or its DDP wrapper) under bf16 autocast: losses and images/s."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses, started = [], time.perf_counter()
    for _ in range(steps):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(module(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {"losses": losses, "images_per_s": steps * len(x) / (time.perf_counter() - started)}


def _two_gpu_trial(args, device: torch.device) -> dict:
    """A Ray Train run of 2 workers, one GPU each (NCCL), against the same trial on one GPU; or why it did not run."""
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if gpus < 2:
        return {"ran": False, "why": f"NCCL between 2 GPUs not checked: this machine has {gpus} GPU(s)"}
    from vitplast_tune.run.parallel import Workers, train_on_workers

    cfg = FinetuneConfig(
        model=args.model,
        pretrained=False,
        dataset="digits",
        augment="none",
        precision="fp32",
        max_steps=8,
        eval_every=4,
        batch_size=args.batch_size,
        warmup_steps=2,
        eval_test=False,
    )
    one: list[dict] = []
    vt_training.finetune(cfg, report=lambda m, s: one.append(m), device=device)
    two: list[dict] = []
    with common.local_ray(cpus=2, gpus=2), common.scratch("gpu_check_ddp_") as tmp:
        train_on_workers(cfg, Workers(count=2, cpus=1, gpus=1, storage=str(tmp)), relay=lambda m, c: two.append(m))
    gap = max(abs(a["train_loss"] - b["train_loss"]) for a, b in zip(two, one))
    if len(two) != len(one) or gap > 1e-4:
        raise AssertionError(f"2 GPUs over NCCL: loss curve {two} against one GPU's {one}")
    return {"ran": True, "max_abs_gap_train_loss": gap, "images_per_s": two[-1]["images_per_s"]}


SUMMARIES = {
    "trials": "two trials at 0.5 GPU on one GPU and a measurement task: device, precision, memory cap asserted",
    "finetune": "the real finetune loop with CUDA sync warnings on: images/s, syncs per step and where",
    "subsets": "fp32 / CUDA options; each subset's speedup vs its FLOP bound; peak memory per subset",
    "pipeline": "the batched input transform 32 -> 224 px on the device, as a share of a step",
    "checkpoint": "a trial's checkpoint of full finetuning written and read back: bytes, seconds",
    "measurements": "plasticity (digits vs fractals) and the gradient criteria, as before a search's trials",
    "precision": "bf16 autocast vs fp32 losses over a few steps from the same weights (within 5%)",
    "compile": "torch.compile: the compile time of the first step, the compiled steps' speedup",
    "ddp": "bf16 DDP on one GPU vs no DDP (losses, images/s); NCCL between 2 GPUs where there are 2",
}
STEPS = {
    "trials": step_trials,
    "finetune": step_finetune,
    "subsets": step_subsets,
    "pipeline": step_pipeline,
    "checkpoint": step_checkpoint,
    "measurements": step_measurements,
    "precision": step_precision,
    "compile": step_compile,
    "ddp": step_ddp,
}


# ----------------------------------------------------------------------------- the check


def chosen(args) -> list[str]:
    """The steps to run: all, or ``--steps-only``'s (each a known step: ``parse_args``)."""
    if not args.steps_only:
        return list(STEPS)
    return [n.strip() for n in args.steps_only.split(",")]


def plan(args) -> list[str]:
    """What the check runs, one line per step, with its timeout."""
    lines = [f"{args.model}, batch {args.batch_size}, {args.warmup} + {args.steps} steps each, on {args.device}:"]
    for name in chosen(args):
        lines.append(f"  {name:<12} (timeout {TIMEOUTS[name] * args.slower:>4} s) {SUMMARIES[name]}")
    return lines


def run_check(args) -> dict:
    """Every chosen step, each within its timeout; the results so far written to ``--json`` after each."""
    device = torch.device(args.device)
    result: dict = {
        "model": args.model,
        "device": vt_devices.device_name(torch.device("cuda", 0)) if device.type == "cuda" else "cpu",
        "batch_size": args.batch_size,
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "steps": {},
    }
    started = time.perf_counter()
    for name in chosen(args):
        result["steps"][name] = run_step(name, lambda n=name: STEPS[n](args, device), TIMEOUTS[name] * args.slower)
        result["total_s"] = time.perf_counter() - started
        common.write_json(args.json, result)  # after each step: a check stopped from outside keeps what it found
    return result


def headline(name: str, r: dict) -> str:
    """One line of what a finished step found."""
    if r["status"] != "ok":
        return r.get("reason", "")
    if name == "trials":
        t = r["trials"]
        return f"{len(t)} trials on {r['expected']['device']}, {r['expected']['precision']}, memory cap " + (
            f"{r['expected']['gpu_memory_fraction']}; task on {r['task_device']}"
        )
    if name == "finetune":
        return f"{r['images_per_s']:.1f} images/s ({r['precision']}); " + (
            f"{r['syncs_per_step']:.2f} syncs per step at {r['sync_sites']}" if r["sync_debug"] else "no GPU"
        )
    if name == "subsets":
        full = r["full"]
        return f"full: fp32 {full['fp32']['images_per_s']:.1f}, CUDA options {full['options']['images_per_s']:.1f} images/s"
    if name == "pipeline":
        return f"{r['step_s'] * 1e3:.2f} ms per batch, {r['share_of_step']:.1%} of a step"
    if name == "checkpoint":
        return f"{r['bytes'] / 2**20:.0f} MiB written in {r['write_s']:.2f} s ({r['mib_per_s']:.0f} MiB/s), read in {r['read_s']:.2f} s"
    if name == "measurements":
        return f"plasticity {r['plasticity_s']:.1f} s ({r['pairs']} pairs), gradient criteria {r['gradients_s']:.1f} s"
    if name == "precision":
        return f"bf16 vs fp32 losses over {len(r['losses']['fp32'])} steps: at most {r['max_relative_gap']:.2%} apart"
    if name == "ddp":
        runs, two = r["runs"], r["two_gpus"]
        pair = (
            two["why"] if not two["ran"] else f"2 GPUs over NCCL: loss curve within {two['max_abs_gap_train_loss']:.1e}"
        )
        return (
            f"bf16 DDP ({r['backend']}) {runs['ddp']['images_per_s']:.1f} vs {runs['plain']['images_per_s']:.1f} "
            f"images/s without, losses within {r['max_relative_gap']:.1e}; {pair}"
        )
    if name == "compile":
        return f"compile {r['compile_s']:.1f} s ({r['backend']}); {r['speedup']:.2f}x the eager steps after"
    return ""


def format_table(result: dict) -> str:
    """The check's results as text."""
    lines = [
        f"{result['model']} on {result['device']}, batch {result['batch_size']} ({result['date']}, torch "
        f"{result['torch']}): {result['total_s']:.0f} s",
        "",
        "step          status   seconds  result",
    ]
    for name, r in result["steps"].items():
        lines.append(f"  {name:<12} {r['status']:<8} {r['seconds']:>7.1f}  {headline(name, r)}")
    subsets = result["steps"].get("subsets", {})
    if subsets.get("status") == "ok":
        lines += ["", "subset (CUDA options)  speedup  FLOP bound  ratio/bound  peak MiB"]
        for name, r in subsets["subsets"].items():
            ratio = r["speedup"] / r["flop_bound"]
            lines.append(
                f"  {name:<20} {r['speedup']:>7.2f}x {r['flop_bound']:>10.2f}x {ratio:>12.2f}  {r['peak_mib']:>8.0f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print("\n".join(plan(args)), flush=True)
    if args.dry_run:
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run this on a GPU node (or --cpu-dry-run)", file=sys.stderr)
        return 2
    result = run_check(args)
    print(format_table(result))
    common.write_json(args.json, result)
    return 0 if all(r["status"] == "ok" for r in result["steps"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
