"""Check a recommendation with a short grid search and judge whether it held."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from vitplast_tune.components import ALL, HEAD
from vitplast_tune.recommend.ranking import Recommendation

VERIFY_LRS: tuple[float, ...] = (0.03, 0.1, 0.3)


def verify_space(
    rec: Recommendation, k: int, directory: Path, *, lrs: Sequence[float] = VERIFY_LRS, max_steps: int | None = None
) -> Path:
    """Write a grid space file over the top ``k`` subsets, full finetuning and the linear probe, times ``lrs``."""
    subsets = list(dict.fromkeys([*rec.ranked["components"].head(k), ALL, HEAD]))
    keep = (
        "model", "weights", "pretrained", "dataset", "data_dir",
        "batch_size", "max_steps", "warmup_fraction", "eval_every",
    )  # fmt: skip
    given = rec.settings.to_dict()
    defaults = {key: given[key] for key in keep if given.get(key) is not None}
    if max_steps:
        defaults["max_steps"] = max_steps
    defaults.setdefault("warmup_fraction", 0.1)
    raw = {
        "description": f"recommend --verify {k}: the top {k} subsets by {rec.criterion}, all and head (grid)",
        "metric": "val_acc",
        "mode": "max",
        "algorithm": "grid",
        "num_samples": 1,
        "scheduler": "fifo",
        "parameters": {"components": {"choice": subsets}, "lr": {"choice": list(lrs)}, "optimizer": "sgd"},
        "defaults": defaults,
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"recommend_verify_{k}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def verification(rec: Recommendation, trials: pd.DataFrame, k: int) -> pd.DataFrame:
    """Tabulate each verified configuration at its best learning rate, with its predicted and actual rank."""
    ok = trials[trials["best_val_acc"].notna()]
    best = ok.loc[ok.groupby("components")["best_val_acc"].idxmax()]
    table = best[["components", "lr", "best_val_acc", "test_acc", "trainable_params"]].copy()
    predicted = dict(zip(rec.ranked["components"].head(k), range(1, k + 1)))
    table["predicted_rank"] = table["components"].map(predicted)
    table = table.sort_values("test_acc", ascending=False, kind="stable").reset_index(drop=True)
    table["actual_rank"] = np.arange(1, len(table) + 1)
    return table


def verdict(table: pd.DataFrame) -> str:
    """Judge whether the top-ranked subset beat the median configuration, one finding a line."""
    if table["predicted_rank"].notna().sum() == 0:
        return "nothing to judge: no recommended subset finished"
    top = table[table["predicted_rank"] == 1].iloc[0]
    median = table["test_acc"].median()
    held = top["test_acc"] >= median
    lines = [
        f"top-ranked subset {top['components']}: test accuracy {100 * top['test_acc']:.2f}% "
        f"{'>=' if held else '<'} the median of the {len(table)} configurations ({100 * median:.2f}%): "
        f"{'the recommendation held' if held else 'the recommendation did NOT hold'}"
    ]
    best = table.iloc[0]
    if best["components"] != top["components"]:
        lines.append(
            f"the best configuration was {best['components']} ({100 * best['test_acc']:.2f}%), "
            f"predicted rank {'-' if pd.isna(best['predicted_rank']) else int(best['predicted_rank'])}"
        )
    ranked = table.dropna(subset=["predicted_rank"])
    if len(ranked) >= 3 and ranked["test_acc"].nunique() > 1:
        rho = stats.spearmanr(-ranked["predicted_rank"], ranked["test_acc"]).statistic
        lines.append(
            f"rank agreement over the {len(ranked)} recommended subsets: Spearman {rho:+.2f} "
            f"({'positive' if rho > 0 else 'not positive'}; n={len(ranked)} is too few for an interval)"
        )
    for name in (ALL, HEAD):
        row = table[table["components"] == name]
        if len(row):
            lines.append(f"vs {name}: {100 * (top['test_acc'] - row['test_acc'].iloc[0]):+.2f} points")
    return "\n".join(lines)


def describe_verification(table: pd.DataFrame) -> str:
    """Describe the verification table and the verdict as text."""
    shown = table.assign(
        predicted_rank=table["predicted_rank"].map(lambda v: "" if pd.isna(v) else int(v)),
        best_val_acc=table["best_val_acc"].map(lambda v: f"{100 * v:.2f}%"),
        test_acc=table["test_acc"].map(lambda v: f"{100 * v:.2f}%"),
        trainable_params=table["trainable_params"].map(lambda v: f"{int(v):,}"),
    )
    return (
        "Verification (each configuration at its best-validation lr; ranked by test accuracy):\n"
        + shown.to_string(index=False)
        + "\n"
        + verdict(table)
    )
