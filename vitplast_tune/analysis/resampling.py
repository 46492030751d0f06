"""Resample configurations, then each one's seeds, choosing the learning rate again on every resample."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from vitplast_tune.analysis.correlation import _numeric, _require_columns
from vitplast_tune.components import subset_name


@dataclass
class Runs:
    """Hold each configuration's runs as (rates, seeds) arrays of the selection metric and the target."""

    keys: list[tuple]  # one per configuration, in the arrays' order
    lrs: list[np.ndarray]
    select: list[np.ndarray]
    target: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.keys)

    def subset(self, mask: np.ndarray) -> Runs:
        """Keep the configurations where ``mask`` is true, in order."""
        chosen = np.flatnonzero(mask)
        return Runs(*([getattr(self, f)[i] for i in chosen] for f in ("keys", "lrs", "select", "target")))


def runs_of(
    trials: pd.DataFrame,
    configs: list[tuple],
    keys: tuple[str, ...] = ("components",),
    *,
    select: str = "best_val_acc",
    target: str = "test_acc",
) -> Runs:
    """Gather each configuration's runs from a trial table, with seed 0 for every run when it has no seeds.

    Args:
        trials: The trial table.
        configs: The configurations, as tuples of the ``keys`` columns' values.
        keys: The columns that make a configuration.
        select: The metric that picks a rate.
        target: The metric reported at the chosen rate.

    Returns:
        Each configuration's runs.

    Raises:
        UserError: If the trial table lacks a column it needs.
    """
    _require_columns(trials, [*keys, "lr", select, target])
    frame = pd.DataFrame({k: trials[k].to_numpy() for k in keys})
    if "components" in keys:
        frame["components"] = [subset_name(c) for c in trials["components"]]
    frame["lr"] = _numeric(trials["lr"])
    frame["seed"] = trials["seed"].to_numpy() if "seed" in trials else 0
    frame["_select"], frame["_target"] = _numeric(trials[select]), _numeric(trials[target])
    both = np.isfinite(frame["_select"]) & np.isfinite(frame["_target"])  # best_lr_table also keeps only these
    frame.loc[~both, ["_select", "_target"]] = np.nan
    groups = {(k if isinstance(k, tuple) else (k,)): g for k, g in frame.groupby(list(keys), sort=False)}
    out = Runs([], [], [], [])
    for config in configs:
        runs = groups[tuple(config)]
        sel, tgt = (
            runs.pivot_table(index="lr", columns="seed", values=c, aggfunc="mean", dropna=False)
            for c in ("_select", "_target")
        )
        tgt = tgt.reindex(index=sel.index, columns=sel.columns)
        out.keys.append(tuple(config))
        out.lrs.append(sel.index.to_numpy(float))
        out.select.append(sel.to_numpy(float))
        out.target.append(tgt.to_numpy(float))
    return out


def best_target(select: np.ndarray, target: np.ndarray, axis_seeds: int = -1) -> np.ndarray:
    """Return the mean target at the rate with the best mean selection metric, for arrays (rates, ..., seeds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rate with no finite run gives NaN, the worst
        chosen = np.nanmean(select, axis=axis_seeds)
        reached = np.nanmean(target, axis=axis_seeds)
    chosen = np.where(np.isnan(chosen), -np.inf, chosen)
    best = np.argmax(chosen, axis=0)
    return np.take_along_axis(reached, best[None], axis=0)[0]


def point_targets(runs: Runs) -> np.ndarray:
    """Return each configuration's mean target at its best rate, without resampling."""
    return np.array([float(best_target(s, t)) for s, t in zip(runs.select, runs.target)])


def resample(runs: Runs, n_boot: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n_boot`` seeded resamples of the configurations, then of each drawn configuration's seeds.

    Args:
        runs: The runs of each configuration.
        n_boot: How many resamples.
        seed: The seed.

    Returns:
        The drawn configurations and their targets at their best rates, both shaped (n_boot, configurations).
    """
    rng = np.random.default_rng(seed)
    n = len(runs)
    drawn = rng.integers(0, n, size=(n_boot, n))
    targets = np.empty((n_boot, n))
    for c in range(n):
        slots = np.nonzero(drawn == c)
        if len(slots[0]) == 0:
            continue
        seeds = runs.select[c].shape[1]
        columns = rng.integers(0, seeds, size=(len(slots[0]), seeds))
        targets[slots] = best_target(runs.select[c][:, columns], runs.target[c][:, columns])
    return drawn, targets
