"""The benchmarks' logic (no timing here): FLOP bounds, finetune's timing metrics, the search replay, the budget
curve's table and the coverage threshold."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import budget, coverage, data, gpu_check, gpu_search, memory, search, training
from vitplast_tune.records.table import trial_subset
from vitplast_tune.run import OptunaSearcher
from vitplast_tune.space import Choice, OptunaSpace, load_space
from vitplast_tune.vit.training import FinetuneConfig, finetune

ROOT = Path(__file__).resolve().parents[1]


def test_flop_bounds_match_the_skipped_weight_gradients():
    bounds = training.flop_bounds("vit_base_patch16_224", 128)
    assert bounds["all"] == 1.0
    for ln in ("ln1", "ln2"):
        assert bounds[ln] == pytest.approx(1.5, abs=0.05)
    for big in ("mha", "fc1", "fc2"):
        assert bounds[big] == pytest.approx(1.3, abs=0.05)
    assert bounds["head"] > 1000  # a head step on cached features is a single small matmul


def test_flop_count_of_full_finetuning_and_of_the_head_on_cached_features():
    from vitplast_tune.vit.models import create_model

    model = create_model("vit_testbed_patch8_32", 10, pretrained=False)
    tokens, width, depth = 17, 96, 4  # 16 patches + the class token
    linears = 2.0 * tokens * (width * 3 * width + width * width + 2 * width * 4 * width)
    attention = 2 * 2.0 * tokens * tokens * width  # Q K^T and A V
    patch = 2.0 * 16 * 3 * 8 * 8 * width
    head = 2.0 * width * 10
    # forward F; backward: input gradients (two for the attention matmuls) + weight gradients,
    # none for the image's gradient through the patch embedding
    assert training.step_flops(model, "all", 1) == pytest.approx(
        2 * patch + depth * (3 * linears + 3 * attention) + 3 * head
    )
    assert training.step_flops(model, "head", 1) == pytest.approx(3 * head)
    assert training.step_flops(model, "all", 64) == pytest.approx(64 * training.step_flops(model, "all", 1))


def test_finetune_reports_cumulative_timing():
    reports = []
    cfg = FinetuneConfig(
        model="vit_testbed_patch8_32",
        pretrained=False,
        max_steps=8,
        eval_every=4,
        warmup_steps=2,
        batch_size=16,
        threads=1,
        components="ln1",
    )
    finetune(cfg, report=lambda m, s: reports.append(m))
    first, last = reports
    for key in ("time_setup_s", "time_in_steps_s", "time_in_eval_s"):
        assert last[key] >= first[key] > 0
    assert last["time_setup_s"] == first["time_setup_s"]
    assert last["steps_per_s"] == pytest.approx(4 / (last["time_in_steps_s"] - first["time_in_steps_s"]), rel=1e-6)


def _curve(*accs, every=100):
    return [
        {"step": every * (i + 1), "val_acc": a, "best_val_acc": max(accs[: i + 1]), "diverged": 0}
        for i, a in enumerate(accs)
    ]


class _Queue:
    def __init__(self, configs):
        self.configs = list(configs)

    def __call__(self, trial_id):
        return self.configs.pop(0) if self.configs else None


def test_replay_counts_finished_steps_until_the_target_and_asha_stops_at_rungs():
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    curves = {
        ("mha", 0.1): _curve(0.5, 0.6, 0.7, 0.8),
        ("ln1", 0.1): _curve(0.2, 0.3, 0.3, 0.3),
        ("all", 0.1): _curve(0.6, 0.8, 0.9, 0.95),
    }
    order = [{"components": c, "lr": 0.1} for c in ("mha", "ln1", "all")]
    steps, finished, _ = search.replay(curves, _Queue(order), search.NoSearcher(), FIFOScheduler(), 1, 0.95, 10)
    assert (steps, finished) == (1200, 3)
    asha = ASHAScheduler(
        time_attr="step", metric="val_acc", mode="max", max_t=400, grace_period=100, reduction_factor=3
    )
    steps, finished, _ = search.replay(curves, _Queue(order), search.NoSearcher(), asha, 1, 0.95, 10)
    assert (steps, finished) == (400 + 100 + 400, 3)  # ln1 is below the first rung's cutoff at step 100
    steps, finished, spent = search.replay(curves, _Queue(order[:2]), search.NoSearcher(), FIFOScheduler(), 1, 0.99, 10)
    assert steps is None and finished == 2 and spent == 800


def test_replay_drives_the_search_optuna_searcher():
    import optuna
    from ray.tune.schedulers import FIFOScheduler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = SimpleNamespace(
        parameters={
            "components": Choice("components", ("mha", "ln1")),
            "lr": Choice("lr", (0.1,)),
        }
    )
    curves = {("mha", 0.1): _curve(0.5, 0.9), ("ln1", 0.1): _curve(0.2, 0.3)}
    searcher = OptunaSearcher(
        space=OptunaSpace(spec.parameters),
        metric="val_acc",
        mode="max",
        sampler=optuna.samplers.TPESampler(seed=0),
    )
    steps, finished, _ = search.replay(curves, searcher.suggest, searcher, FIFOScheduler(), 1, 0.9, 20)
    assert steps == 200 * finished and finished >= 1


def test_gpu_check_plans_every_step_within_ten_minutes(capsys):
    assert gpu_check.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in gpu_check.STEPS)
    assert sum(gpu_check.TIMEOUTS.values()) <= 590
    assert set(gpu_check.TIMEOUTS) == set(gpu_check.STEPS) == set(gpu_check.SUMMARIES)
    with pytest.raises(SystemExit) as refused:
        gpu_check.main(["--dry-run", "--steps-only", "trials,speed"])
    assert refused.value.code == 2 and 'argument --steps-only: unknown "speed"' in capsys.readouterr().err


def test_the_gpu_checks_subset_bounds_are_those_of_the_steps_it_times(monkeypatch):
    """Its steps run the whole forward pass for every subset, the head's too: the head's bound is then that of a
    step with the backbone's forward (about 3x on the testbed), not of a head on cached features (millions)."""
    args = gpu_check.parse_args(["--cpu-dry-run"])
    speeds = {"all": 1.0, "head": 0.25}  # seconds per step: the head at 4x

    def timed(args, device, subset, options, compile_=False):
        return {"images_per_s": 8 / speeds.get(subset, 0.5), "step_s": speeds.get(subset, 0.5), "peak_mib": 0.0}

    monkeypatch.setattr(gpu_check, "train_speed", timed)
    head = gpu_check.step_subsets(args, gpu_check.torch.device("cpu"))["subsets"]["head"]
    assert head["speedup"] == 4.0 and 2.0 < head["flop_bound"] < 4.0
    assert training.flop_bounds(args.model, args.batch_size, ["head"])["head"] > 1000  # on cached features


def test_a_gpu_check_step_past_its_timeout_is_stopped_and_reported():
    result = gpu_check.run_step("slow", lambda: __import__("time").sleep(5) or {}, timeout_s=0.5)
    assert result["status"] == "timeout" and result["seconds"] < 3
    failed = gpu_check.run_step("broken", lambda: 1 / 0, timeout_s=5)
    assert failed["status"] == "failed" and "ZeroDivisionError" in failed["reason"]


@pytest.mark.slow
def test_gpu_check_runs_every_step_on_the_cpu(tmp_path):
    import json

    printed = run_benchmark(
        "gpu_check", "--cpu-dry-run", "--json", str(tmp_path / "gpu.json")
    )  # its own Ray, as a user runs it
    result = json.loads((tmp_path / "gpu.json").read_text())
    steps = result["steps"]
    assert list(steps) == list(gpu_check.STEPS) and all(r["status"] == "ok" for r in steps.values()), steps
    trials = steps["trials"]
    assert len(trials["trials"]) == 2 and all(
        t["device"] == "cpu" and t["precision"] == "fp32" for t in trials["trials"].values()
    )
    assert trials["checks"]["both trials at once"] and trials["task_device"] == "cpu"
    assert set(steps["subsets"]["subsets"]) == {"all", "emb", "ln1", "mha", "ln2", "fc1", "fc2", "head"}
    assert steps["subsets"]["subsets"]["mha"]["flop_bound"] == pytest.approx(
        1.3, abs=0.1
    )  # benchmarks.training's bound
    assert 0 < steps["pipeline"]["share_of_step"] < 1
    assert steps["checkpoint"]["bytes"] > 0 and steps["measurements"]["pairs"] == 32
    assert steps["precision"]["max_relative_gap"] < 0.05 and steps["compile"]["backend"] == "aot_eager"
    assert "subset (CUDA options)" in printed


def test_the_gpu_search_benchmarks_figures_and_its_flag_checks(tmp_path, monkeypatch, capsys):
    one = gpu_search.trial_timeline([(10, 20), (22, 30), (31, 40)], 1, started=4)
    assert one["before_first_trial_s"] == 6 and one["gaps_s"] == [2, 1] and one["trial_phase_s"] == 30
    assert one["no_trial_share"] == pytest.approx(3 / 30) and one["mean_running"] == pytest.approx(27 / 30)
    two = gpu_search.trial_timeline([(0, 10), (1, 5), (6, 12), (11, 15)], 2, started=0)  # each takes a freed slot
    assert two["gaps_s"] == [1, 1] and two["no_trial_share"] == 0 and two["mean_running"] == pytest.approx(24 / 15)
    assert gpu_search.busy_share([(0, 100), (1, 50), (2, 0), (9, 100)], 1, 2) == 0.25
    assert gpu_search.flop_fraction(2e12, 64, 64, peak=4.0) == 0.5  # 2 TFLOP a step, a step a second, 4 TFLOPS
    peaks = {n: gpu_search.peak_tflops(f"NVIDIA {n}", None)[0] for n in ("H100 PCIe", "H100 80GB HBM3", "L40S")}
    assert peaks == {"H100 PCIe": 756, "H100 80GB HBM3": 989, "L40S": 362}  # the first name found wins
    assert gpu_search.peak_tflops("cpu: EPYC", None)[0] is None and gpu_search.peak_tflops("cpu", 2.0)[0] == 2.0
    monkeypatch.setattr(gpu_search, "run_search", lambda *a: pytest.fail("a search started after a bad flag"))
    monkeypatch.setattr(gpu_search, "measure_step", lambda *a: pytest.fail("work started after a bad flag"))
    (tmp_path / "file").write_text("")
    refused = {
        "--shares 0.3": "--shares 0.3: each share is 1/k",
        "--models vit_nope_patch16_224": "unknown timm model",
        "--trials 0": "--trials 0: at least 1",
        "--max-steps 10 --eval-every 20": "--eval-every 20: at most --max-steps (10)",
        "--peak-tflops -1": "--peak-tflops",
        f"--json {tmp_path / 'file' / 'r.json'}": "is a file, not a folder",
        f"--page {tmp_path}": "is a folder",
        "": "no CUDA device here",  # the flags are good, and no GPU
    }
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # the same on a GPU machine
    for flags, said in refused.items():
        argv = flags.split()
        argv += [] if "--json" in argv else ["--json", str(tmp_path / "r.json")]
        argv += [] if "--page" in argv else ["--page", str(tmp_path / "r.md")]
        try:
            code = gpu_search.main(argv)
        except SystemExit as exit:  # a flag's type refuses it as the flags are parsed
            code = exit.code
        assert code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, (flags, err)
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "r.md").exists()


@pytest.mark.slow
def test_the_gpu_search_benchmarks_cpu_dry_run_runs_a_real_search_on_shares_of_a_cpu(ray_local, tmp_path):
    """One search of 3 trials, 2 at once on halves of the CPU, through the product's search; then one trial alone."""
    import json

    assert gpu_search.main(["--cpu-dry-run", "--json", str(tmp_path / "r.json"), "--page", str(tmp_path / "r.md")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    (search,), (step,) = result["searches"], result["steps"]
    assert (search["trials"], search["slots"], search["share"], search["images"]) == (3, 2, 0.5, 3 * 4 * 8)
    assert search["images_per_s_wall"] == pytest.approx(search["images"] / search["wall_s"]) and search["wall_s"] > 0
    assert 0 < search["tune_start_s"] < search["before_first_trial_s"] < search["wall_s"]
    assert len(search["gaps_s"]) == 1 and search["gaps_s"][0] >= 0 and search["mean_running"] > 1  # 2 ran at once
    assert search["x_alone_wall"] == pytest.approx(search["images_per_s_wall"] / step["eager"]["images_per_s"])
    assert step["compiled"]["images_per_s"] > 0 and step["backend"] == "aot_eager"
    from vitplast_tune.vit.models import create_model

    testbed = create_model("vit_testbed_patch8_32", 10, pretrained=False)  # the counter agrees with the FLOP model
    assert step["flops_per_step"] == pytest.approx(training.step_flops(testbed, "all", 8, cached_head=False))
    assert step["eager"]["of_peak"] is None and step["syncs_per_step"] is None and "busy_trial_phase" not in search
    reasons = [result["busy_reason"], step["fraction_reason"], step["syncs_reason"]]
    assert all(r.startswith("not measured on CPU: ") for r in reasons)
    page = (tmp_path / "r.md").read_text()
    assert "a dry run on the CPU" in page and "| vit_testbed_patch8_32 | 0.5 | 2 | 3 |" in page
    assert all(f"- {r}" in page for r in reasons) and "not judged here" in page


@pytest.mark.slow
def test_checkpoint_benchmark_measures_bytes_and_seconds_on_disk_and_s3(tmp_path):
    out = tmp_path / "checkpoint.json"
    printed = run_benchmark("checkpoint", "--subsets", "head,mha", "--reports", "3", "--json", str(out))
    import json

    result = json.loads(out.read_text())
    for storage in ("local", "s3"):
        head, mha = result[storage]["head"], result[storage]["mha"]
        assert 0 < head["bytes"] < mha["bytes"] and mha["report_s"] >= mha["write_s"] > 0
    assert result["local"]["mha"]["bytes"] == result["s3"]["mha"]["bytes"]
    assert "MiB/checkpoint" in printed


def test_bench_data_times_every_input_path_including_the_image_cache():
    from vitplast_tune.vit import models

    speeds = data.pipelines(models.pretrained_data_config("vit_testbed_patch8_32"), 4, 0.01)
    assert "image cache (256 px) + train, per image" in speeds and len(speeds) == 7
    assert all(speed > 0 for speed in speeds.values())


def test_bench_data_byte_table():
    rows = {r["dataset"]: r for r in data.host_bytes(batch_size=64)}
    assert rows["digits"]["before_trial"] == 1797 * 3 * 224 * 224 * 4 and rows["digits"]["after_node"] == 1797 * 64
    assert rows["cifar10c:<corruption>"]["after_node"] == 10000 * 3 * 32 * 32


@pytest.mark.slow
def test_bench_memory_samples_the_driver_and_its_ray_processes():
    found = memory.measure(
        "vit_testbed_patch8_32", "digits", ["grad_checkpointing=true"]
    )  # a wrong setting would fail the search
    assert 0.3e9 < found["driver_rss"] < found["tree_rss"]  # ray and mlflow, never torch
    assert not found["driver_torch"]  # not even at the end: the best model is built in a worker
    assert 0 < found["end_driver_rss"] <= found["driver_rss"]  # the samples cover the end of the search
    assert found["worker_pss"] > 0.1e9  # the best model's worker, seen (torch and the model)
    # The Ray processes add to the driver. PSS, not RSS, on the driver's side: its pages shared with processes
    # outside the tree (another test's torch) count partly, and the tree's PSS may fall below the driver's RSS.
    assert found["at_peak"]["driver"]["pss"] < found["tree_pss"] <= found["tree_rss"]
    assert 0 < found["tree_anon"] < found["tree_pss"]  # the mapped libraries are the rest
    parts = found["at_peak"]
    # The tree's peak: while it trains, or while the worker builds the best model beside Ray's processes.
    assert "driver" in parts and {"trial", memory.WORKER} & set(parts)
    assert set(parts) <= {"driver", "trial", memory.WORKER, "Ray's processes"}
    assert 0 < found["training_pss"] <= found["tree_pss"]
    assert sum(p["pss"] for p in parts.values()) == found["tree_pss"]
    assert all(0 < p["anon"] < p["pss"] for p in parts.values())


def test_replay_of_tpe_with_warm_start_tries_the_recommended_subsets_first(tmp_path):

    spec = load_space(
        _write(
            tmp_path / "s.yaml", "algorithm: optuna\nparameters: {components: {subsets: any}, lr: {choice: [0.1]}}\n"
        )
    )
    specs = {name: spec for name in ("grid", "random", "random_asha", "optuna", "optuna_asha")}
    made = search.algorithms(specs, 400, tmp_path, 10, warm_start=["fc2", "mha+fc1"])
    assert {"TPE + warm start", "TPE + ASHA + warm"} <= set(made) and "random + ASHA" in made
    suggest, _, _ = made["TPE + warm start"](0)
    assert [trial_subset(suggest(f"t{i}")) for i in range(2)] == ["fc2", "mha+fc1"]


def _write(path, text):
    path.write_text(text)
    return path


def test_the_budget_curve_summarises_seeds_per_budget_and_rate():
    runs = [
        {"budget": b, "lr": 0.1, "seed": s, "val_acc": v, "best_val_acc": v, "test_acc": v - 0.01}
        for b, s, v in [(150, 0, 0.80), (150, 1, 0.84), (600, 0, 0.95), (600, 1, 0.97)]
    ]
    rows = {r["budget"]: r for r in budget.summary(runs)}
    assert rows[150]["val_acc"] == pytest.approx(0.82) and rows[150]["val_acc_min"] == 0.80
    assert rows[600]["test_acc_max"] == pytest.approx(0.96) and rows[600]["seeds"] == 2
    assert "| 600 | 0.1 | 2 | 96.00% [95.00, 97.00]" in budget.markdown(budget.summary(runs))


def test_the_coverage_threshold_is_the_first_n_from_which_every_scenario_holds():
    rows = [
        {"n": n, "scenario": s, "coverage": c}
        for n, s, c in [(4, "a", 0.80), (4, "b", 0.95), (6, "a", 0.93), (6, "b", 0.88), (8, "a", 0.91), (8, "b", 0.94)]
        + [(10, "a", 0.89), (10, "b", 0.95), (12, "a", 0.92), (12, "b", 0.96)]
    ]
    assert coverage.threshold(rows, 0.05) == 12  # 10 falls below 90% again
    assert coverage.threshold(rows, 0.10) == 6
    assert coverage.threshold(rows, 0.0) is None
    assert coverage.population_spearman(0.0) == 0.0 and coverage.population_spearman(1.0) == pytest.approx(1.0)


def test_the_optimizer_benchmark_pairs_each_run_and_reports_the_paired_difference():
    from benchmarks import optimizer

    jobs = optimizer.jobs(seeds=(0, 1), max_steps=8)
    plain = [j for j in jobs if j["variant"] == "torch"]
    assert len(plain) == 2 * sum(1 for row in optimizer.GRID if row[3] is None)  # layer decay: timm's only
    assert all({**j, "variant": "timm"} in jobs for j in plain)
    runs = [{**j, "best_val_acc": 0.5, "val_acc": 0.5, "train_loss": 1.0, "test_acc": 0.5} for j in jobs]
    for r in runs:
        if r["variant"] == "timm" and r["seed"] == 1:
            r["test_acc"] = 0.53
    text = optimizer.table(runs)
    assert "+1.50 pts (per seed +0.00, +3.00)" in text


def test_the_optimizer_benchmarks_baseline_decays_every_parameter():
    import torch

    from benchmarks import optimizer

    layer = torch.nn.Linear(3, 2)
    layer.bias.requires_grad_(False)
    built = optimizer.plain_optimizer(FinetuneConfig(weight_decay=0.1), layer, torch.device("cpu"))
    assert [(g["weight_decay"], len(g["params"])) for g in built.param_groups] == [(0.1, 1)]


def run_benchmark(name: str, *args: str) -> str:
    """``python -m benchmarks.NAME ARGS`` from the repository's root, in a process of its own (its own Ray instance,
    not this test session's); its stdout, after asserting exit 0."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args], capture_output=True, text=True, timeout=900, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout
