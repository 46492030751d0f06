"""Training speed and peak memory of each single-component trial and of the head-only trial,
as ratios to full finetuning of the same model and batch, beside the FLOP bound.

Every configuration runs the real ``vitplast_tune.vit.training.finetune`` (freezing through
``freezing.freeze``; the head-only run trains on its cached backbone features, as trials do)
in a fresh subprocess; the steps/s come from finetune's own ``time_in_steps_s`` between a
report after the warm-up steps and the last one (evaluation excluded). Configurations take turns,
``--repeats`` rounds, and the median is reported, so load drift on a shared machine hits all alike.
On the CPU the ratios are also computed from the process's CPU time over the same steps (the
validation split is made tiny, so the window holds the steps and next to nothing else): on a
machine shared with other work, wall time also measures the others' load, CPU time only the steps'
own work. The goal column uses CPU time on the CPU and wall time on CUDA.

The bound is the step FLOPs of full finetuning over the step FLOPs of the subset, from the
model's shapes: forward FLOPs F of every matmul/conv (attention's QK^T and AV included);
backward = input-gradient FLOPs of every op whose input depends on a trainable parameter (F per
such input; QK^T and AV have two) + weight-gradient FLOPs F of every trainable weight. LayerNorms,
activations and the optimizer count zero. The head and the final norm always train.

Peak memory, from one more short run per configuration (its own fresh subprocess): CUDA,
torch.cuda.max_memory_allocated over the run; CPU, the process's resident-set high-water mark
(VmHWM, reset through /proc/self/clear_refs) minus the resident set just before finetune is called
(after a 2-step warm-up run that loads the kernels, and malloc_trim), with the dataset already decoded
as the search shares it, and glibc's mmap threshold fixed at 64 KiB so that freed tensors leave the
resident set. It counts everything finetune allocates: model, its train/val/test split of the data
(a constant ~21 MiB for digits at 32 px), feature cache, activations, grads and optimizer state.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.common import SUBSETS
from vitplast_tune import components
from vitplast_tune.vit import models


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument(
        "--model",
        default="vit_testbed_patch8_32",
        help="timm ViT, randomly initialised (default: vit_testbed_patch8_32)",
    )
    p.add_argument("--dataset", default="digits", help="dataset, upscaled to the model's input size (default: digits)")
    p.add_argument("--batch-size", type=common.at_least(1), default=64, help="training batch (default: 64)")
    p.add_argument("--steps", type=common.at_least(1), default=100, help="timed steps per configuration (default: 100)")
    p.add_argument("--warmup", type=common.at_least(0), default=20, help="untimed steps before them (default: 20)")
    p.add_argument(
        "--repeats",
        type=common.at_least(1),
        default=3,
        help="rounds over all configurations; the median is reported (default: 3)",
    )
    p.add_argument(
        "--subsets",
        type=common.listed(common.subset),
        default=",".join(SUBSETS),
        help=f"comma-separated subsets; 'all' is always run (default: {','.join(SUBSETS)})",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument(
        "--threads", type=common.at_least(1), default=1, help="torch CPU threads, as a 1-CPU trial has (default: 1)"
    )
    p.add_argument(
        "--cuda-options",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="CUDA only: bf16 autocast + TF32 + fused optimizer, as trials run (default); --no-cuda-options: plain fp32. "
        "On CUDA, full finetuning is also timed in the other mode and both images/s are printed",
    )
    p.add_argument("--compile", action="store_true", help="finetune with compile=True (torch.compile of the model)")
    p.add_argument(
        "--trial-steps",
        type=common.at_least(1),
        default=400,
        help="trial length for the head-only speed-up including its feature cache (default: 400)",
    )
    common.add_json_flag(p)
    p.add_argument("--child", help=argparse.SUPPRESS)  # internal: one measurement, as JSON
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- FLOP bound


def step_flops(model: torch.nn.Module, subset: str, batch: int, cached_head: bool = True) -> float:
    """Matmul/conv FLOPs of one training step (forward + backward) of ``subset`` at ``batch``.

    ``cached_head``: a head-only step runs on cached backbone features (forward = the head only).
    """
    chosen = set(components.parse_subset(subset))
    patches = model.patch_embed.num_patches
    tokens = patches + model.num_prefix_tokens
    total = 0.0

    def op(forward: float, input_live: bool, weight_trains: bool, inputs: int = 1) -> None:
        nonlocal total
        total += forward * (1 + (inputs if input_live else 0) + (1 if weight_trains else 0))

    def linear(layer: torch.nn.Linear, rows: int) -> float:
        return 2.0 * rows * layer.in_features * layer.out_features

    if chosen or not cached_head:
        conv = model.patch_embed.proj
        op(
            2.0 * batch * patches * conv.in_channels * math.prod(conv.kernel_size) * conv.out_channels,
            False,
            "emb" in chosen,
        )
        live = "emb" in chosen  # cls/pos tokens are emb too
        for block in model.blocks:
            attn, mlp = block.attn, block.mlp
            a = live or "ln1" in chosen
            op(linear(attn.qkv, batch * tokens), a, "mha" in chosen)
            a = a or "mha" in chosen
            width = attn.qkv.out_features // 3
            op(2.0 * batch * tokens * tokens * width, a, False, inputs=2)  # Q K^T, all heads
            op(2.0 * batch * tokens * tokens * width, a, False, inputs=2)  # softmax(.) V
            op(linear(attn.proj, batch * tokens), a, "mha" in chosen)
            live = live or a
            m = live or "ln2" in chosen
            op(linear(mlp.fc1, batch * tokens), m, "fc1" in chosen)
            m = m or "fc1" in chosen
            op(linear(mlp.fc2, batch * tokens), m, "fc2" in chosen)
            live = live or m or "fc2" in chosen
    op(linear(model.head, batch), True, True)  # the final norm trains, so the head's input gradient is always needed
    return total


def flop_bounds(model_name: str, batch: int, subsets=SUBSETS, cached_head: bool = True) -> dict[str, float]:
    """Full-finetuning step FLOPs over each subset's step FLOPs (the speed-up the skipped work allows);
    ``cached_head`` as in ``step_flops``."""
    model = models.create_model(model_name, 10, pretrained=False)
    full = step_flops(model, "all", batch)
    return {s: full / step_flops(model, s, batch, cached_head) for s in subsets}


# ----------------------------------------------------------------------------- one measurement (child process)


def _own_memory(key: str) -> int:
    """A /proc/self/status memory line (VmRSS, VmHWM) in bytes (Linux)."""
    return common.kb_field(Path("/proc/self/status").read_text(), key)


def _start_peak_memory(cfg, device: torch.device, decoded) -> int:
    """Reset the peak-memory count before the measured run; return the baseline it is counted above (bytes)."""
    from vitplast_tune.vit.training import FinetuneConfig, finetune

    if device.type == "cuda":
        common.sync(device)
        torch.cuda.reset_peak_memory_stats()
        return 0
    # Touch the kernels' code and one-time buffers (a 2-step run at batch 2), so that the baseline holds them.
    warm = dict(components="all", batch_size=2, max_steps=2, eval_every=2, compile=False, cache_features=False)
    finetune(FinetuneConfig(**{**cfg.to_dict(), **warm}), device=device, decoded=decoded)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back to the OS, so finetune cannot reuse it unseen
    baseline = _own_memory("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    return baseline


def measure(spec: dict) -> dict:
    """Run finetune for one configuration and return its steps/s, setup time and peak memory."""
    from vitplast_tune.data import datasets
    from vitplast_tune.vit.training import FinetuneConfig, finetune

    device = torch.device(spec["device"])
    cfg = FinetuneConfig(
        model=spec["model"],
        pretrained=False,
        dataset=spec["dataset"],
        components=spec["subset"],
        lr=0.01,
        batch_size=spec["batch_size"],
        max_steps=spec["warmup"] + spec["steps"],
        eval_every=spec["warmup"],
        warmup_steps=0,
        threads=spec["threads"],
        compile=spec["compile"],
        cuda_options=spec["cuda_options"],
        precision="auto" if spec["cuda_options"] else "fp32",  # the plain fp32 baseline has no autocast either
        eval_test=False,
        val_fraction=0.2 if spec["memory"] else 0.01,  # timing: a tiny evaluation inside the CPU-time window
    )
    torch.set_num_threads(spec["threads"])
    decoded = datasets.decode_dataset(cfg.dataset, models.pretrained_data_config(cfg.model))  # as the search shares it
    reports: list[dict] = []
    cpu_at: list[float] = []
    baseline = _start_peak_memory(cfg, device, decoded) if spec["memory"] else 0
    finetune(
        cfg,
        report=lambda metrics, state: (reports.append(metrics), cpu_at.append(time.process_time())),
        device=device,
        decoded=decoded,
    )
    if spec["memory"]:
        peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _own_memory("VmHWM") - baseline
        return {"peak_bytes": peak}
    first, last = reports[0], reports[-1]
    steps = last["step"] - first["step"]
    return {
        "steps_per_s": steps / (last["time_in_steps_s"] - first["time_in_steps_s"]),
        "cpu_steps_per_s": steps / (cpu_at[-1] - cpu_at[0]),
        "setup_s": last["time_setup_s"],
        "cache_s": last["time_feature_cache_s"],
    }


def run_child(spec: dict, **env: str) -> dict:
    """``measure(spec)`` in a fresh ``python -m benchmarks.training --child`` process (``env``: extra variables)."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.training", "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=common.python_env(**env),
    )
    if out.returncode != 0:
        raise RuntimeError(f"measuring {spec['subset']} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- the rounds


def chosen_subsets(text: str) -> list[str]:
    """The --subsets, 'all' first and each once; a bad name raises UserError."""
    subsets = ["all"] + [s for s in dict.fromkeys(x.strip() for x in text.split(",")) if s and s != "all"]
    for s in subsets:
        components.parse_subset(s)
    return subsets


def run_rounds(args: argparse.Namespace, base: dict, subsets: list[str], other_mode: bool) -> dict[str, list[dict]]:
    """--repeats rounds over the subsets (and, on CUDA, full finetuning in the other mode): each run's figures."""
    runs: dict[str, list[dict]] = {s: [] for s in subsets + (["all/other"] if other_mode else [])}
    for repeat in range(args.repeats):
        for s in subsets:
            runs[s].append(run_child({**base, "subset": s}))
            r = runs[s][-1]
            print(
                f"  round {repeat + 1}/{args.repeats} {s:<5} {r['steps_per_s']:8.1f} steps/s ({r['cpu_steps_per_s']:.1f} per CPU second)",
                file=sys.stderr,
                flush=True,
            )
        if other_mode:
            runs["all/other"].append(run_child({**base, "subset": "all", "cuda_options": not args.cuda_options}))
    return runs


def peak_memory(args: argparse.Namespace, base: dict, subsets: list[str], device: torch.device) -> dict[str, int]:
    """Peak bytes of each subset, from one more short run each.

    On the CPU with a fixed malloc mmap threshold, so that freed tensors leave the resident set (glibc's
    adaptive threshold would otherwise keep them in its heap).
    """
    env = {"MALLOC_MMAP_THRESHOLD_": "65536"} if device.type == "cpu" else {}
    return {
        s: run_child({**base, "subset": s, "memory": True, "steps": min(args.steps, 10)}, **env)["peak_bytes"]
        for s in subsets
    }


# ----------------------------------------------------------------------------- the table


def print_header(args: argparse.Namespace, device: torch.device) -> None:
    cpu = device.type == "cpu"
    mem_note = (
        "torch.cuda.max_memory_allocated"
        if not cpu
        else "process RSS high-water mark above the RSS before finetune (fresh subprocess, fixed mmap threshold)"
    )
    mode = (
        ("bf16 autocast + TF32 + fused optimizer" if args.cuda_options else "plain fp32")
        if not cpu
        else "fp32 (CUDA options do not apply on CPU)"
    )
    print(
        f"{args.model} on {args.dataset}, batch {args.batch_size}, {device} ({mode}), torch threads {args.threads}{', compiled' if args.compile else ''}: "
        f"median of {args.repeats} rounds of {args.steps} steps after {args.warmup}; peak memory = {mem_note}; "
        f"goal judged on {'CPU-time' if cpu else 'wall-time'} ratios"
    )
    print(
        f"{'subset':<6} {'steps/s':>8} {'images/s':>9} {'vs full':>8} {'(CPU t)':>8} {'bound':>9} {'vs bound':>9} {'peak MiB':>9} {'mem vs full':>12}  goal"
    )


def subset_goal(subset: str, judged: float, of_bound: float) -> str:
    """The goal column: none for full finetuning, >= 10x for the head alone, within 10% of the bound for the rest."""
    if subset == "all":
        return ""
    if subset == "head":
        return common.goal(judged >= 10, ">= 10x")
    return common.goal(of_bound >= 0.9, "within 10% of bound")


def table(
    args: argparse.Namespace, subsets: list[str], runs: dict[str, list[dict]], memory: dict[str, int], cpu: bool
) -> list[dict]:
    """Print a row per subset (medians over rounds; ratios to full finetuning in the same round); return the rows."""
    med = medians(runs)
    bounds = flop_bounds(args.model, args.batch_size, subsets)

    def ratio(s: str, k: str) -> float:
        """Median over rounds of the ratio to full finetuning in the same round."""
        return statistics.median(r[k] / f[k] for r, f in zip(runs[s], runs["all"]))

    rows = []
    for s in subsets:
        m = med[s]
        wall = ratio(s, "steps_per_s")
        cpu_ratio = ratio(s, "cpu_steps_per_s")
        of_bound = (cpu_ratio if cpu else wall) / bounds[s]
        mem = memory[s] / memory["all"]
        rows.append(
            dict(
                subset=s,
                steps_per_s=m["steps_per_s"],
                cpu_steps_per_s=m["cpu_steps_per_s"],
                images_per_s=m["steps_per_s"] * args.batch_size,
                speedup_wall=wall,
                speedup_cpu_time=cpu_ratio,
                bound=bounds[s],
                of_bound=of_bound,
                peak_mib=memory[s] / 2**20,
                peak_bytes=memory[s],
                mem_ratio=mem,
                rounds=runs[s],
            )
        )
        print(
            f"{s:<6} {m['steps_per_s']:8.1f} {m['steps_per_s'] * args.batch_size:9.0f} {wall:7.2f}x {cpu_ratio:7.2f}x {bounds[s]:8.2f}x "
            f"{of_bound:9.2f} {memory[s] / 2**20:9.1f} {mem:11.2f}x  {subset_goal(s, cpu_ratio if cpu else wall, of_bound)}"
        )
    return rows


def medians(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Each configuration's figures, medians over the rounds."""
    return {s: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for s, rs in runs.items()}


def head_only_trial(args: argparse.Namespace, med: dict[str, dict[str, float]]) -> float:
    """Print what the head-only feature cache costs a --trial-steps trial; return its seconds."""
    full = med["all"]
    cache_s = med["head"]["cache_s"]
    trial = args.trial_steps / (args.trial_steps / med["head"]["steps_per_s"] + cache_s)
    print(
        f"head-only feature cache: {cache_s:.2f} s once per trial (= {cache_s * full['steps_per_s']:.0f} full steps); "
        f"a {args.trial_steps}-step head-only trial including it: {trial / full['steps_per_s']:.1f}x full finetuning"
    )
    return cache_s


def both_modes(args: argparse.Namespace, med: dict[str, dict[str, float]]) -> dict[str, float]:
    """Print full finetuning's images/s with and without the CUDA options; return them."""
    full = med["all"]
    fast, plain = (full, med["all/other"]) if args.cuda_options else (med["all/other"], full)
    print(
        f"full finetuning images/s: {fast['steps_per_s'] * args.batch_size:.0f} with CUDA options, "
        f"{plain['steps_per_s'] * args.batch_size:.0f} plain fp32 ({fast['steps_per_s'] / plain['steps_per_s']:.2f}x)"
    )
    return {
        "cuda_options": fast["steps_per_s"] * args.batch_size,
        "plain_fp32": plain["steps_per_s"] * args.batch_size,
    }


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return 0
    device = common.pick_device(args.device)
    subsets = chosen_subsets(args.subsets)
    base = dict(
        model=args.model,
        dataset=args.dataset,
        batch_size=args.batch_size,
        steps=args.steps,
        warmup=args.warmup,
        device=str(device),
        threads=args.threads,
        compile=args.compile,
        cuda_options=args.cuda_options,
        memory=False,
    )
    other_mode = device.type == "cuda"
    runs = run_rounds(args, base, subsets, other_mode)
    memory = peak_memory(args, base, subsets, device)
    print_header(args, device)
    rows = table(args, subsets, runs, memory, device.type == "cpu")
    summary = {"args": {k: v for k, v in vars(args).items() if k != "child"}, "device": str(device), "rows": rows}
    med = medians(runs)
    if "head" in med:
        summary["head_cache_s"] = head_only_trial(args, med)
    if other_mode:
        summary["full_images_per_s"] = both_modes(args, med)
    common.write_json(args.json, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
