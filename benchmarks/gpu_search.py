"""A whole search on one GPU, measured against what the GPU can do (issue 60).

For each model and GPU share per trial, a real search (``run.driver.run``: the search's own trainable, Ray Tune,
Optuna's TPE over the learning rate, MLflow) of ``--trials`` short full-finetuning trials on digits at 224 px (random
init: no hub), at most 1/share at once. It reports the search's training images/s over its wall time against one
trial alone (the same ``finetune`` loop in this process); the GPU's busy share from NVML (``nvidia-smi``, else
``torch.cuda.utilization``, sampled in a thread); the seconds before the first trial and between trials; one trial's
step as a fraction of the peak FLOPs, eager and compiled (``torch.utils.flop_counter``; the peak by the device's name
from ``PEAK_TFLOPS``, or ``--peak-tflops``); the host-device syncs per step (``torch.cuda.set_sync_debug_mode``).
JSON and a dated page naming the machine are written after each search and step, so a run stopped from outside keeps
what it found. Each search starts its own Ray, as a user's does, unless this process already joined one.

    python -m benchmarks.gpu_search                     # ViT-B/16, ViT-S/16 at 0.25, 0.5, 1 GPU per trial
    python -m benchmarks.gpu_search --cpu-dry-run       # the testbed on shares of a CPU, tiny sizes (what a test runs)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

from ray.tune import Callback

from benchmarks import common

# Dense bf16 tensor TFLOPS (no sparsity) from NVIDIA's datasheets; the first name found in the device's name wins.
PEAK_TFLOPS = (("B200", 2250.0), ("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0))
PEAK_TFLOPS += (("A100", 312.0), ("L40S", 362.0), ("L4", 121.0))
ON_CPU = "not measured on CPU"
DRY = dict(models="vit_testbed_patch8_32", shares="0.5", trials=3, max_steps=4, eval_every=4, batch_size=8, window=2)


def parse_args(argv: list[str] | None = None):
    p = common.parser(__doc__)
    p.add_argument("--models", default="vit_base_patch16_224,vit_small_patch16_224", help="timm ViTs, comma-separated")
    p.add_argument("--shares", default="0.25,0.5,1", help="GPU per trial, each 1/k (default: 0.25,0.5,1)")
    p.add_argument("--trials", type=int, default=16, help="trials per search (default: 16)")
    p.add_argument("--max-steps", type=int, default=60, help="training steps per trial (default: 60)")
    p.add_argument("--eval-every", type=int, default=30, help="evaluate every N steps (default: 30)")
    p.add_argument("--batch-size", type=int, default=64, help="training batch (default: 64)")
    p.add_argument("--window", type=int, default=30, help="steps per timed window of one trial alone (default: 30)")
    p.add_argument("--peak-tflops", type=float, help="the device's peak TFLOPS (default: from its name)")
    p.add_argument("--sample-s", type=float, default=0.25, help="seconds between NVML samples (default: 0.25)")
    p.add_argument(
        "--page", type=common.output, help="markdown page (default: docs/results/benchmarks/gpu-search-DATE-gpu.md)"
    )
    p.add_argument("--cpu-dry-run", action="store_true", help="the testbed on the CPU at tiny sizes, CPU shares")
    common.add_json_flag(p, help="results (default: docs/results/data/gpu_search/DATE-gpu.json)")
    args = p.parse_args(argv)
    if args.cpu_dry_run:  # its sizes as defaults: flags given still win
        p.set_defaults(**DRY)
        args = p.parse_args(argv)
    args.device, args.backend = ("cpu", "aot_eager") if args.cpu_dry_run else ("cuda", "inductor")
    return args


def check_args(args) -> str | None:
    """The first problem with the flags, as one line, or None (output paths set and checked writable here)."""
    from vitplast_tune.errors import UserError
    from vitplast_tune.vit.models import check_model_name

    try:
        args.shares = [float(s) for s in args.shares.split(",")]
    except ValueError:
        return f"--shares {args.shares}: numbers, comma-separated (e.g. 0.25,0.5,1)"
    bad = [s for s in args.shares if not 0 < s <= 1 or abs(1 / s - round(1 / s)) > 1e-9]
    if bad:
        return f"--shares {bad[0]:g}: each share is 1/k of the GPU (1, 0.5, 0.25, ...)"
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not args.models:
        return "--models: none given"
    for name in ("trials", "max_steps", "window", "batch_size", "eval_every"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} {getattr(args, name)}: at least 1"
    if args.eval_every > args.max_steps:
        return f"--eval-every {args.eval_every}: at most --max-steps ({args.max_steps})"
    if (args.peak_tflops is not None and args.peak_tflops <= 0) or args.sample_s <= 0:
        return "--peak-tflops and --sample-s: positive numbers"
    try:
        for model in args.models:
            check_model_name(model)
    except UserError as exc:
        return f"--models: {exc}"
    name = f"{time.strftime('%Y-%m-%d')}-{'cpu-dry-run' if args.cpu_dry_run else 'gpu'}"
    args.page = Path(args.page or common.ROOT / f"docs/results/benchmarks/gpu-search-{name}.md")
    args.json = Path(args.json or common.ROOT / f"docs/results/data/gpu_search/{name}.json")
    for path in (args.page, args.json):  # the defaults too: both are written after the work
        try:
            common.output(str(path))
        except argparse.ArgumentTypeError as exc:
            return str(exc)
    return None


def trial_timeline(spans: list[tuple[float, float]], slots: int, started: float) -> dict[str, Any]:
    """From the trials' (start, end) times, ``slots`` running at most at once, the search started at ``started``:
    seconds before the first trial, each handover gap (the i-th trial after the first ``slots`` takes the slot the
    i-th trial to end freed), the trial phase, the share of it with no trial running, trials running on average."""
    starts, ends = sorted(s for s, _ in spans), sorted(e for _, e in spans)
    phase = ends[-1] - starts[0]
    covered, reach = 0.0, starts[0]
    for s, e in sorted(spans):
        covered += max(0.0, e - max(s, reach))
        reach = max(reach, e)
    return {
        "before_first_trial_s": starts[0] - started,
        "gaps_s": [s - e for s, e in zip(starts[slots:], ends)],
        "trial_phase_s": phase,
        "no_trial_share": 1 - covered / phase if phase > 0 else 0.0,
        "mean_running": sum(e - s for s, e in spans) / phase if phase > 0 else float(len(spans)),
    }


def busy_share(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """The mean GPU utilization (NVML's percent, as a share) of the samples taken from ``start`` to ``end``."""
    inside = [u for t, u in samples if start <= t <= end]
    return statistics.fmean(inside) / 100 if inside else None


def peak_tflops(device_name: str, override: float | None) -> tuple[float | None, str]:
    """The device's peak TFLOPS and where it came from, or None and why not."""
    if override is not None:
        return override, "--peak-tflops"
    if device_name.startswith("cpu"):
        return None, f"{ON_CPU}: no peak FLOPs for a CPU (give --peak-tflops)"
    found = next(((n, v) for n, v in PEAK_TFLOPS if n in device_name), None)
    if found is None:
        return None, f"no peak known for {device_name} (give --peak-tflops)"
    return found[1], f"dense bf16 peak of an {found[0]} (PEAK_TFLOPS)"


def flop_fraction(flops_per_step: float, images_per_s: float, batch_size: int, peak: float) -> float:
    """The fraction of ``peak`` TFLOPS that steps of ``flops_per_step`` at ``images_per_s`` reach."""
    return flops_per_step * images_per_s / batch_size / (peak * 1e12)


class Spans(Callback):
    """Driver-side Unix times (to the millisecond) of Tune's start and of each trial's start and end."""

    def __init__(self):
        self.setup_at, self.starts, self.ends = 0.0, {}, {}

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info) -> None:
        self.setup_at = time.time()

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.starts[trial.trial_id] = time.time()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.ends[trial.trial_id] = time.time()

    on_trial_error = on_trial_complete

    def spans(self) -> list[tuple[float, float]]:
        return [(self.starts[t], self.ends[t]) for t in self.starts if t in self.ends]


class BusySampler(threading.Thread):
    """Every ``every`` seconds, (Unix time, GPU utilization in percent) from ``read``, until ``done`` is set."""

    def __init__(self, read, every: float):
        super().__init__(daemon=True)
        self.read, self.every, self.done, self.samples = read, every, threading.Event(), []

    def run(self) -> None:
        while not self.done.wait(self.every):
            with contextlib.suppress(Exception):  # a missed reading is a missing sample, not a failed search
                self.samples.append((time.time(), float(self.read())))


def utilization_reader(device: str):
    """A function reading GPU 0's NVML utilization (percent) and its source, or None and why not."""
    if device == "cpu":
        return None, f"{ON_CPU}: the busy share is NVML's, which a CPU has not"
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "-i", "0", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        return (lambda: subprocess.run(query, capture_output=True, text=True, timeout=5).stdout), "nvidia-smi"
    import torch

    try:
        torch.cuda.utilization(0)
    except Exception as exc:  # torch reads NVML through pynvml (nvidia-ml-py), which may be missing
        return None, f"not measured: no nvidia-smi and torch.cuda.utilization failed ({type(exc).__name__}: {exc})"
    return functools.partial(torch.cuda.utilization, 0), "torch.cuda.utilization (NVML)"


def trial_settings(args, model: str) -> dict[str, Any]:
    """What every trial does (FinetuneConfig fields): full finetuning of a random-init ``model`` on digits."""
    fixed = {"pretrained": False, "dataset": "digits", "components": "all", "eval_test": False}
    steps = {"max_steps": args.max_steps, "eval_every": args.eval_every, "warmup_steps": max(1, args.max_steps // 10)}
    return {**fixed, **steps, "model": model, "batch_size": args.batch_size}


def run_search(args, model: str, share: float, reader) -> dict[str, Any]:
    """One search of ``args.trials`` trials at ``share`` of the device each (CPU shares in the dry run), timed."""
    from vitplast_tune.run.driver import run

    slots, gpu = round(1 / share), args.device == "cuda"
    defaults = {k: v for k, v in trial_settings(args, model).items() if k != "components"}
    space = {
        **{"metric": "val_acc", "mode": "max", "algorithm": "optuna", "num_samples": args.trials, "scheduler": "fifo"},
        "parameters": {"components": "all", "lr": {"loguniform": [1e-3, 3e-2]}, "optimizer": "sgd"},
        "defaults": defaults,
    }
    spans, sampler = Spans(), BusySampler(reader, args.sample_s) if reader else None
    with common.scratch("gpu_search_") as tmp:
        options = common.search_options(
            common.write_space(tmp / "space.yaml", space),
            tmp,
            name=f"gpu-search-{share:g}",
            cpus_per_trial=1 if gpu else share,  # the dry run: shares of one CPU
            gpus_per_trial=share if gpu else 0,
            max_concurrent=slots,
            verbose=0,
        )
        if sampler:
            sampler.start()
        started = time.time()
        result = run(options, callbacks=[spans])
        wall = time.time() - started
        if sampler:
            sampler.done.set()
    found = {"model": model, "share": share, "slots": slots, "wall_s": wall, "tune_start_s": spans.setup_at - started}
    found.update(search_figures(args.batch_size, result.trials, spans.spans(), slots, started, wall))
    found["phases_s"] = result.timings.seconds if result.timings else {}
    if sampler:
        first, last = min(s for s, _ in spans.spans()), max(e for _, e in spans.spans())
        found.update(busy_trial_phase=busy_share(sampler.samples, first, last), samples=len(sampler.samples))
        found["busy_search"] = busy_share(sampler.samples, started, started + wall)
    return found


def search_figures(batch_size: int, trials, spans, slots: int, started: float, wall: float) -> dict[str, Any]:
    """Images/s over the wall and the trial phase, the driver's trial timeline, the trials' share of their slots in
    training steps, and the gaps the records' times give (Tune's whole-second ``timestamp``: each within 1 s)."""
    rows = trials.dropna(subset=["started_at", "ended_at"])
    images = float(trials["step"].fillna(0).sum()) * batch_size
    found = {"trials": len(trials), "images": images, "images_per_s_wall": images / wall}
    found.update(trial_timeline(spans, slots, started))
    found["images_per_s_trial_phase"] = images / found["trial_phase_s"]
    found["slot_share_in_steps"] = float(trials["time_in_steps_s"].sum()) / (slots * found["trial_phase_s"])
    records = trial_timeline(list(zip(rows["started_at"], rows["ended_at"])), slots, started) if len(rows) else {}
    found["record_gaps_s"] = records.get("gaps_s", [])
    return found


def step_flops(model_name: str, batch_size: int, device) -> float:
    """FLOPs of one full-finetuning step's forward and backward pass, counted by ``torch.utils.flop_counter``."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from vitplast_tune.vit import models

    model = models.create_model(model_name, 10, pretrained=False).to(device).train()
    size = models.data_config(model)["input_size"][-1]
    x = torch.randn(batch_size, 3, size, size, device=device)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):  # attention as counted matmuls
        torch.nn.functional.cross_entropy(model(x), torch.zeros(batch_size, dtype=torch.long, device=device)).backward()
    return float(counter.get_total_flops())


def alone(args, model: str, device, compiled: bool) -> tuple[dict, list]:
    """The ``finetune`` loop of one trial alone on the whole device, two windows of ``args.window`` steps: images/s of
    the second (after a compile), the first window's seconds; the sync warnings of an eager loop on CUDA."""
    import torch

    from benchmarks.gpu_check import sync_warnings
    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.vit import training

    settings = {**trial_settings(args, model), "max_steps": 2 * args.window, "eval_every": args.window}
    cfg = FinetuneConfig(**settings, threads=1, compile=compiled)  # threads: a trial's, from its one CPU
    reports: list[dict] = []
    backend = functools.partial(torch.compile, backend=args.backend)  # the dry run: aot_eager, no C++ compile
    with mock.patch.object(torch, "compile", backend), sync_warnings(device) as caught:
        training.finetune(cfg, report=lambda metrics, state: reports.append(metrics), device=device)
    first, last = reports
    return {"images_per_s": last["images_per_s"], "first_window_s": first["time_in_steps_s"]}, list(caught)


def measure_step(args, model: str, machine: str) -> dict[str, Any]:
    """One trial's step: images/s alone, eager and compiled; its FLOPs; their fraction of the peak; syncs per step."""
    import torch

    device = torch.device(args.device)
    eager, caught = alone(args, model, device, compiled=False)
    compiled, _ = alone(args, model, device, compiled=True)
    flops = step_flops(model, args.batch_size, device)
    peak, source = peak_tflops(machine, args.peak_tflops)
    found = {"model": model, "eager": eager, "compiled": compiled, "backend": args.backend, "flops_per_step": flops}
    found.update(peak_tflops=peak, peak_source=source, fraction_reason=None if peak else source)
    for loop in (eager, compiled):
        loop["tflops"] = flops * loop["images_per_s"] / args.batch_size / 1e12
        loop["of_peak"] = flop_fraction(flops, loop["images_per_s"], args.batch_size, peak) if peak else None
    if device.type == "cuda":
        sites = dict(Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught).most_common(6))
        found.update(syncs_per_step=len(caught) / (2 * args.window), sync_sites=sites, syncs_reason=None)
        torch.cuda.empty_cache()
    else:
        found.update(syncs_per_step=None, syncs_reason=f"{ON_CPU}: torch.cuda.set_sync_debug_mode is CUDA's")
    return found


LEGEND = (
    "Share: the GPU per trial (the dry run: of one CPU); at once: `--max-concurrent`. Images/s: the trials' training "
    "images (steps x batch) over the search's wall time (the call to its return: Ray, checks, MLflow, trials, best "
    "model) and over its trial phase (first trial's start to last trial's end, from Tune's callbacks on the driver: "
    "the records' own times are whole seconds); x alone: against one trial's `finetune` loop alone on the whole device "
    "(its training steps, eager). GPU busy: NVML's utilization over the trial phase. Gaps: from a trial's end to the "
    "start of the trial that took its slot. Slots in steps: the trials' seconds in training steps over at once x the "
    "trial phase."
)


SEARCHES = (
    "| model | share | at once | trials | wall s | images/s, wall | trial phase | x alone, wall | x alone, phase "
)
SEARCHES += "| GPU busy, phase | before 1st trial s | gaps s (median, max) | slots in steps |"
STEPS = "| model | alone images/s, eager | compiled | FLOPs per step | of peak, eager | compiled | syncs per step |"


def _num(value, spec: str = ".2f") -> str:
    return "-" if value is None else f"{value:{spec}}"


def _table(header: str, rows: list[list[Any]]) -> list[str]:
    return ["", header, "|" + "---|" * (header.count("|") - 1), *("| " + " | ".join(map(str, r)) + " |" for r in rows)]


def _search_row(s: dict) -> list[Any]:
    gaps = f"{_num(statistics.median(s['gaps_s']))}, {_num(max(s['gaps_s']))}" if s["gaps_s"] else "-"
    rates = [_num(s[k], ".1f") for k in ("wall_s", "images_per_s_wall", "images_per_s_trial_phase")]
    ratios = [_num(s["x_alone_wall"]), _num(s["x_alone_trial_phase"]), _num(s.get("busy_trial_phase"), ".0%")]
    timeline = [_num(s["before_first_trial_s"], ".1f"), gaps, _num(s["slot_share_in_steps"], ".0%")]
    return [s["model"], f"{s['share']:g}", s["slots"], s["trials"], *rates, *ratios, *timeline]


def _step_row(m: dict) -> list[Any]:
    e, c = m["eager"], m["compiled"]
    rates = [f"{e['images_per_s']:.1f}", f"{c['images_per_s']:.1f} ({m['backend']})", f"{m['flops_per_step']:.3g}"]
    return [m["model"], *rates, _num(e["of_peak"], ".1%"), _num(c["of_peak"], ".1%"), _num(m["syncs_per_step"])]


def goal_lines(searches: list[dict]) -> list[str]:
    """Issue 60's goals at 0.25 GPU per trial, judged where measured on a GPU."""
    lines = []
    for s in [s for s in searches if s["share"] == 0.25 and s.get("busy_trial_phase") is not None]:
        x, busy = s["x_alone_wall"], s["busy_trial_phase"]
        lines.append(
            f"- {s['model']} at 0.25 GPU per trial: {_num(x)}x one trial alone over the wall, "
            f"{common.goal(bool(x and x >= 3), '>= 3x')}; GPU busy {busy:.0%} of the trial phase, "
            f"{common.goal(busy >= 0.85, '>= 85%')}"
        )
    return lines or ["Issue 60's goals (at 0.25 GPU per trial: 3x one trial alone, GPU busy 85%): not judged here."]


def page(args, result: dict) -> str:
    """The dated page: the machine, each search, each model's step, the goals where measured, what was not."""
    dry = " (a dry run on the CPU: tiny sizes, shares of a CPU; it shows that the code runs)" * args.cpu_dry_run
    reasons = {result["busy_reason"], *(r for m in result["steps"] for r in (m["fraction_reason"], m["syncs_reason"]))}
    reasons = sorted(filter(None, reasons))
    json_link = os.path.relpath(args.json.absolute(), args.page.absolute().parent)
    lines = [
        f"# A whole search on one device ({result['date']}): {result['machine']}",
        "",
        f"`python -m benchmarks.gpu_search {' '.join(result['argv'])}`{dry}, torch {result['torch']}; "
        f"{args.trials} trials of {args.max_steps} steps at batch {args.batch_size} a search; [the JSON]({json_link}).",
        "",
        LEGEND,
        *_table(SEARCHES, [_search_row(s) for s in result["searches"]]),
        *_table(STEPS, [_step_row(m) for m in result["steps"]]),
        "",
        *goal_lines(result["searches"]),
        "",
        *(["Not measured:", ""] if reasons else []),
        *(f"- {r}" for r in reasons),
    ]
    return "\n".join(lines) + "\n"


def write(args, result: dict) -> None:
    """Each search compared with its model's trial alone (eager) where both are measured; the JSON and the page."""
    alone_by_model = {m["model"]: m["eager"]["images_per_s"] for m in result["steps"]}
    for s in result["searches"]:
        one = alone_by_model.get(s["model"])
        s["x_alone_wall"] = s["images_per_s_wall"] / one if one else None
        s["x_alone_trial_phase"] = s["images_per_s_trial_phase"] / one if one else None
    common.write_json(args.json, result)
    args.page.parent.mkdir(parents=True, exist_ok=True)
    args.page.write_text(page(args, result))


def machine_name(device: str) -> str:
    """The GPU's name, or the CPU's model and cores."""
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    return f"cpu: {found.group(1) if found else 'unknown'}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = check_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here: run this on a GPU node (or --cpu-dry-run)", file=sys.stderr)
        return 2
    reader, source = utilization_reader(args.device)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "machine": machine_name(args.device)}
    result.update(torch=torch.__version__, argv=list(sys.argv[1:] if argv is None else argv), searches=[], steps=[])
    result.update(busy_source=source if reader else None, busy_reason=None if reader else source)
    for model in args.models:  # the step first: a run stopped later still compares its searches with it
        result["steps"].append(measure_step(args, model, result["machine"]))
        write(args, result)
        for share in sorted(args.shares):
            result["searches"].append(run_search(args, model, share, reader))
            write(args, result)
    print(args.page.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
