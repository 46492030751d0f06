"""The Pareto fronts of a search's trials: accuracy against trainable parameters and against throughput, as tables,
the summary's blocks, CSV and plots."""

import pandas as pd

from vitplast_tune import components
from vitplast_tune.records import describe_pareto, pareto_front
from vitplast_tune.records.pareto import write_pareto


def _trials(rows):
    columns = ["components", "lr", "best_val_acc", "val_acc", "test_acc", "trainable_params", "images_per_s", "step"]
    table = pd.DataFrame(rows, columns=columns)
    return table.assign(max_steps=400, diverged=False, error=None)


TRIALS = _trials(
    [
        ("head", 0.1, 0.90, 0.90, 0.89, 650, 9000.0, 400),
        ("ln1", 0.1, 0.89, 0.89, 0.88, 1_000, 2000.0, 400),  # dominated: more params, less accuracy than head
        ("mha", 0.1, 0.97, 0.97, 0.96, 150_000, 1500.0, 400),
        ("mha", 0.3, 0.97, 0.96, 0.95, 150_000, 1600.0, 400),  # same params, same accuracy: the first one stays
        ("fc1", 0.1, 0.96, 0.96, 0.95, 150_000, 1700.0, 400),  # same params, less accuracy
        ("all", 0.03, 0.995, 0.99, 0.98, 600_000, 1000.0, 400),
        ("all", 1.0, 0.999, 0.99, 0.98, 600_000, 1200.0, 100),  # stopped early: not a full-budget trial
    ]
)


def test_pareto_front_by_trainable_parameters():
    front = pareto_front(TRIALS, "trainable_params", "min")
    assert list(zip(front["components"], front["lr"])) == [("head", 0.1), ("mha", 0.1), ("all", 0.03)]


def test_pareto_front_by_throughput_keeps_faster_or_more_accurate_trials():
    front = pareto_front(TRIALS, "images_per_s", "max")
    # head is the fastest; ln1 is slower and worse than head; mha lr=0.1 is slower than mha lr=0.3 at the same accuracy
    assert list(zip(front["components"], front["lr"])) == [("head", 0.1), ("fc1", 0.1), ("mha", 0.3), ("all", 0.03)]


def test_pareto_front_of_no_finished_trial_is_empty():
    assert pareto_front(TRIALS[TRIALS["step"] < 400], "trainable_params").empty


def test_summary_prints_the_pareto_blocks_under_the_top_table():
    text = describe_pareto(TRIALS)
    assert "vs fewer trainable parameters (3 of the full-budget trials" in text
    assert "vs more training images/s (4 of the full-budget trials" in text and "9,000" in text


def test_the_pareto_front_labels_lora_bitfit_and_full_points_by_method_and_depth():
    trials = _trials(
        [
            ("head", 0.1, 0.80, 0.80, 0.79, 1_162, 9000.0, 400),
            ("all:bitfit", 0.3, 0.86, 0.86, 0.85, 5_482, 3000.0, 400),
            ("mha:lora+fc1:lora", 0.3, 0.93, 0.93, 0.92, 34_954, 2000.0, 400),
            ("fc1", 0.1, 0.92, 0.92, 0.91, 150_922, 2500.0, 400),  # more parameters, less accuracy than the LoRA
            ("all", 0.03, 0.95, 0.95, 0.94, 600_000, 1000.0, 400),
        ]
    )
    trials["method"] = [components.method_label(c) for c in trials["components"]]
    trials["depth"] = ["all", "all", "last", "all", "all"]
    front = pareto_front(trials, "trainable_params")
    assert list(front["method"]) == ["head", "bitfit", "lora", "full"]
    text = describe_pareto(trials).splitlines()
    assert text[1].split()[:4] == ["components", "method", "depth", "lr"]
    assert text[4].split()[:3] == ["mha:lora+fc1:lora", "lora", "last"]
    assert text[5].split()[:3] == ["all", "full", "all"]
    plain = trials[trials["method"].isin(["full", "head"])].assign(depth="all")
    assert "method" not in describe_pareto(plain)  # a search of full finetuning alone reads as before


def test_write_pareto_writes_csv_and_png(tmp_path):
    files = write_pareto(TRIALS, tmp_path / "analysis")
    assert {f.name for f in files} == {
        "pareto_trainable_params.csv",
        "pareto_trainable_params.png",
        "pareto_images_per_s.csv",
        "pareto_images_per_s.png",
    }
    assert len(pd.read_csv(tmp_path / "analysis" / "pareto_trainable_params.csv")) == 3
