"""Hand-made trial and plasticity tables the analysis tests share."""

from __future__ import annotations

import numpy as np
import pandas as pd


def make_trials() -> pd.DataFrame:
    rows = []
    # (components, {lr: accuracy for seeds 0 and 1})
    plan = {
        "head": {1e-3: (0.50, 0.52), 1e-2: (0.60, 0.62)},
        "ln1": {1e-3: (0.70, 0.70), 1e-2: (0.65, 0.66)},
        "all": {1e-3: (0.90, 0.92), 1e-2: (0.80, 0.70)},
        "mha": {1e-3: (0.80, 0.81), 1e-2: (0.84, 0.82)},
        "mha+fc1": {1e-3: (0.99, 0.99), 1e-2: (0.99, 0.99)},
        "fc1": {1e-3: (0.75, 0.79), 1e-2: (0.70, np.nan)},
    }
    for components, by_lr in plan.items():
        for lr, accs in by_lr.items():
            for seed, acc in zip((0, 1), accs):
                rows.append({"components": components, "lr": lr, "seed": seed, "val_acc": acc, "test_acc": acc - 0.01})
    return pd.DataFrame(rows)


def plasticity_table() -> pd.DataFrame:
    rows = [{"component": "emb", "layer": 0, "plasticity": 0.3, "std": 0.01, "sem": 0.001, "n_pairs": 10}]
    for value, component in enumerate(["ln1", "mha", "ln2", "fc1", "fc2"]):
        for layer in range(3):
            rows.append(
                {
                    "component": component,
                    "layer": layer,
                    "plasticity": value + 0.1 * layer,
                    "std": 0.1,
                    "sem": 0.03,
                    "n_pairs": 10,
                }
            )
    table = pd.DataFrame(rows)
    table.attrs["variant"] = "paper"
    return table


def is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(b"\x89PNG")


def grid_trials() -> pd.DataFrame:
    """A hand-made grid: 3 seeds x 2 lrs; best_val_acc picks the lr, test_acc is reported there."""
    plan = {  # components: {lr: (best_val_acc per seed, test_acc per seed)}
        "head": {0.01: ((0.50, 0.52, 0.54), (0.40, 0.42, 0.44)), 0.1: ((0.60, 0.60, 0.60), (0.50, 0.50, 0.50))},
        "mha": {0.01: ((0.90, 0.90, 0.90), (0.80, 0.82, 0.84)), 0.1: ((0.95, 0.40, 0.90), (0.99, 0.99, 0.99))},
        "ln1": {0.01: ((0.70, 0.70, 0.70), (0.55, 0.55, 0.55)), 0.1: ((0.80, 0.80, 0.80), (0.60, 0.62, 0.64))},
        "fc1": {0.01: ((0.85, 0.85, 0.85), (0.75, 0.75, 0.75)), 0.1: ((0.80, 0.80, 0.80), (0.90, 0.90, 0.90))},
        "mha+fc1": {0.01: ((0.99, 0.99, 0.99), (0.90, 0.90, 0.90)), 0.1: ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))},
    }
    plasticity = {"mha": 3.0, "fc1": 2.0, "ln1": 1.0, "mha+fc1": 2.5}
    params = {"head": 10, "mha": 1000, "ln1": 20, "fc1": 2000, "mha+fc1": 3000}
    rows = []
    for components, by_lr in plan.items():
        for lr, (vals, tests) in by_lr.items():
            for seed, v, t in zip((0, 42, 3407), vals, tests):
                rows.append(
                    {
                        "components": components,
                        "lr": lr,
                        "seed": seed,
                        "best_val_acc": v,
                        "test_acc": t,
                        "plasticity_mean": plasticity.get(components, np.nan),
                        "trainable_params": params[components],
                    }
                )
    return pd.DataFrame(rows)


def depth_trials():
    """mha (full and LoRA) and fc1 at three depths, two learning rates, two seeds; mha is best where it is most
    plastic (last), fc1 is best first although it is most plastic last."""
    rows = []
    accuracy = {("mha", "first"): 0.80, ("mha", "middle"): 0.85, ("mha", "last"): 0.90, ("mha:lora", "first"): 0.70}
    accuracy.update({("mha:lora", "middle"): 0.75, ("mha:lora", "last"): 0.78, ("fc1", "first"): 0.95})
    accuracy.update({("fc1", "middle"): 0.90, ("fc1", "last"): 0.85})
    plasticity = {"first": 1.0, "middle": 2.0, "last": 3.0}
    for (components, depth), acc in accuracy.items():
        for lr in (0.1, 0.3):
            for seed in (0, 1):
                rows.append(
                    {
                        "components": components,
                        "depth": depth,
                        "lr": lr,
                        "seed": seed,
                        "best_val_acc": acc + (0.01 if lr == 0.3 else 0.0),
                        "test_acc": acc + (0.01 if lr == 0.3 else 0.0) + 0.001 * seed,
                        "plasticity_mean": plasticity[depth] * (2 if components.startswith("fc1") else 1),
                        "plasticity_max": plasticity[depth],
                        "trainable_params": 1000
                        * (3 if depth == "middle" else 1)
                        * (0.1 if "lora" in components else 1),
                    }
                )
    return pd.DataFrame(rows)


BLOCK_SUBSETS = [
    "+".join(c for c, bit in zip(("ln1", "mha", "ln2", "fc1", "fc2"), bits) if bit)
    for bits in __import__("itertools").product((0, 1), repeat=5)
    if any(bits)
]


def lab_trials(
    seed: int = 0, *, noise: float = 0.005, edge: str | None = None, lrs=(0.1, 0.3, 1.0), seeds=(0, 42, 3407)
) -> pd.DataFrame:
    """A lab's grid with a known answer: the 31 block subsets, each with a true accuracy (``quality``) that rises with
    its size, best at lr 0.3 (``edge``: best at 3.0, beyond the grid); ``good`` is the true accuracy plus small noise,
    ``bad`` its negative, ``copy`` the parameter count itself plus a tiny jitter, ``noise`` unrelated."""
    rng = np.random.default_rng(seed)
    rows = []
    for subset in BLOCK_SUBSETS:
        k = subset.count("+") + 1
        params = 1000 * k * (1 + rng.random())
        quality = 0.5 + 0.06 * k + rng.normal(0, 0.04)
        best = 3.0 if subset == edge else 0.3
        scores = {
            "good": quality + rng.normal(0, 0.005),
            "bad": -quality,
            "copy": np.log(params) + rng.normal(0, 1e-6),
            "noise": rng.normal(),
            "plasticity_mean": quality + rng.normal(0, 0.005),
        }
        for lr in lrs:
            for s in seeds:
                val = quality - 0.05 * abs(np.log10(lr / best)) + rng.normal(0, noise)
                rows.append(
                    {
                        "components": subset,
                        "lr": lr,
                        "seed": s,
                        "best_val_acc": val,
                        "test_acc": val + rng.normal(0, noise),
                    }
                    | {"trainable_params": params, **scores}
                )
    return pd.DataFrame(rows)
