"""The GPU check (issue 12): ViT-B/16 at 224 px on one GPU, in under 8 minutes. Prints a table, writes JSON.

1. training images/s of full finetuning: fp32 (no TF32, plain optimizer); with the CUDA options the
   trials use (bf16 autocast, TF32 matmuls, fused optimizer); and with those plus torch.compile;
2. each single component's and the head's speedup over full finetuning (CUDA options) beside its
   FLOP bound (``flop_bounds`` of benchmarks.training), and the peak GPU memory of each subset;
3. the input pipeline's share of a step on CIFAR-size data: the batched transform of uint8 32 px
   images to 224 px on the GPU (``vitplast_tune.data.transforms``) over that plus a training step;
4. 4 trials at ``--gpus-per-trial 0.25`` through the real search (scripts/search.py, digits).

    python -m benchmarks.gpu_check --json gpu_check.json
    python -m benchmarks.gpu_check --dry-run                            # the plan, nothing run
    python -m benchmarks.gpu_check --device cpu --model vit_testbed_patch8_32 --steps 2 --warmup 1 \\
        --batch-size 4 --no-compile --no-search                         # the CPU smoke path the tests run
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks import common, training
from benchmarks.common import SUBSETS
from vitplast_tune import components
from vitplast_tune.data import transforms
from vitplast_tune.vit import models

SEARCH_COMPONENTS = ["mha", "fc1", "fc2", "all"]  # the 4 trials sharing one GPU


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--model", default="vit_base_patch16_224", help="timm ViT, randomly initialised")
    p.add_argument("--device", default="cuda", help="cuda (the check) or cpu (a smoke run)")
    p.add_argument("--batch-size", type=int, default=64, help="training batch (default: 64)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per configuration (default: 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them (default: 5)")
    p.add_argument("--search-steps", type=int, default=60, help="steps of each of the 4 search trials (default: 60)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile measurement")
    p.add_argument("--no-search", action="store_true", help="skip the 4-trial search")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    common.add_json_flag(p, help="write the results here")
    return p.parse_args(argv)


def train_speed(args, device: torch.device, subset: str, options: bool, compile_: bool = False) -> dict[str, float]:
    """Training images/s of ``subset`` and its peak GPU memory (MiB; 0 on a CPU)."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = options
    model = models.create_model(args.model, 10, pretrained=False)
    components.freeze(model, subset)
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    fused = options and device.type == "cuda"
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, fused=fused or None)
    forward = torch.compile(model) if compile_ else model
    size = models.data_config(model)["input_size"][-1]
    x = torch.randn(args.batch_size, 3, size, size, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)

    def step(_: int) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=options):
            loss = F.cross_entropy(forward(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    reset = (lambda: torch.cuda.reset_peak_memory_stats(device)) if device.type == "cuda" else None
    step_s = common.seconds_per_call(step, device, args.warmup, args.steps, after_warmup=reset)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    return {"images_per_s": args.batch_size / step_s, "step_s": step_s, "peak_mib": peak}


def pipeline_step_s(args, device: torch.device) -> float:
    """Seconds to turn a batch of uint8 32 px images into normalized 224 px training images on ``device``."""
    config = models.pretrained_data_config(args.model)
    raw = torch.from_numpy(np.random.default_rng(0).integers(0, 255, (args.batch_size, 3, 32, 32), dtype=np.uint8))
    run = lambda seed: transforms.batch_transform(raw.to(device, non_blocking=True), config, True, seed)
    return common.seconds_per_call(run, device, args.warmup, args.steps)


def search_trials(args) -> dict:
    """4 trials at --gpus-per-trial 0.25 through scripts/search.py: wall time and the trials' steps."""
    space = common.grid_space(
        {"components": {"choice": SEARCH_COMPONENTS}, "lr": 0.01},
        {
            "model": args.model,
            "pretrained": False,
            "dataset": "digits",
            "max_steps": args.search_steps,
            "batch_size": args.batch_size,
            "warmup_steps": 2,
            "eval_every": args.search_steps,
        },
        description="GPU check, 4 trials sharing one GPU.",
    )
    with common.scratch("gpu_check_") as tmp:
        flags = ["--no-plasticity", "--gpus-per-trial", "0.25", "--cpus-per-trial", "1"]
        command = common.search_command(common.write_space(tmp / "gpu.yaml", space), tmp, "gpu", *flags)
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=common.python_env())
        wall = time.perf_counter() - start
        trials = (tmp / "gpu" / "trials.csv").read_text() if proc.returncode == 0 else proc.stderr[-2000:]
    return {"returncode": proc.returncode, "wall_s": wall, "trials_csv": trials}


def plan(args) -> list[str]:
    """What the check runs, one line each."""
    lines = [
        f"{args.model}, batch {args.batch_size}, {args.warmup} + {args.steps} steps each, on {args.device}:",
        "  full finetuning: fp32; bf16 autocast + TF32 + fused SGD" + ("" if args.no_compile else "; + torch.compile"),
        f"  each of {', '.join(SUBSETS[1:])} with the CUDA options: speedup vs full, FLOP bound, peak memory",
        "  the batched input transform 32 -> 224 px on the device, as a share of a step",
    ]
    if not args.no_search:
        lines.append(f"  4 trials at --gpus-per-trial 0.25 through scripts/search.py ({args.search_steps} steps each)")
    return lines


def run_check(args) -> dict:
    """Every measurement of the check, as a dict."""
    device = torch.device(args.device)
    result: dict = {
        "model": args.model,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "batch_size": args.batch_size,
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
    }
    result["full"] = {
        "fp32": train_speed(args, device, "all", False),
        "options": train_speed(args, device, "all", True),
    }
    if not args.no_compile:
        result["full"]["options+compile"] = train_speed(args, device, "all", True, compile_=True)
    bounds = training.flop_bounds(args.model, args.batch_size, SUBSETS)
    full = result["full"]["options"]["step_s"]
    result["subsets"] = {}
    for subset in SUBSETS[1:]:
        speed = train_speed(args, device, subset, True)
        result["subsets"][subset] = {**speed, "speedup": full / speed["step_s"], "flop_bound": bounds[subset]}
    result["subsets"]["all"] = {**result["full"]["options"], "speedup": 1.0, "flop_bound": 1.0}
    pipeline = pipeline_step_s(args, device)
    result["pipeline"] = {"step_s": pipeline, "share_of_step": pipeline / (pipeline + full)}
    if not args.no_search:
        result["search"] = search_trials(args)
    return result


def format_table(result: dict) -> str:
    """The check's results as text tables."""
    lines = [
        f"{result['model']} on {result['device']}, batch {result['batch_size']} ({result['date']})",
        "",
        "full finetuning        images/s  peak MiB",
    ]
    for name, r in result["full"].items():
        lines.append(f"  {name:<20} {r['images_per_s']:>8.1f}  {r['peak_mib']:>8.0f}")
    lines += ["", "subset (CUDA options)  speedup  FLOP bound  ratio/bound  peak MiB"]
    for name, r in result["subsets"].items():
        ratio = r["speedup"] / r["flop_bound"]
        lines.append(
            f"  {name:<20} {r['speedup']:>7.2f}x {r['flop_bound']:>10.2f}x {ratio:>12.2f}  {r['peak_mib']:>8.0f}"
        )
    p = result["pipeline"]
    lines += [
        "",
        f"input pipeline (uint8 32 px -> 224 px on the device): {p['step_s'] * 1e3:.2f} ms per batch, "
        f"{p['share_of_step']:.1%} of a step",
    ]
    if "search" in result:
        s = result["search"]
        lines += [
            "",
            f"4 trials at --gpus-per-trial 0.25: exit {s['returncode']}, {s['wall_s']:.0f} s",
            s["trials_csv"],
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print("\n".join(plan(args)))
    if args.dry_run:
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here: run this on a GPU node (or --device cpu for a smoke run)", file=sys.stderr)
        return 2
    result = run_check(args)
    print(format_table(result))
    common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
