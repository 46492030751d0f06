"""The hierarchical bootstrap of a grid with seeds: configurations resampled, and within each drawn configuration its
seeds, with its learning rate chosen again on each resample, so the seeds' noise and the choice of rate reach every
interval.

A configuration's runs are two (rates, seeds) arrays, the selection metric (mean validation accuracy picks the rate)
and the target (test accuracy there), NaN where a run is missing. A resample draws the configurations with
replacement; each drawn one draws its seed columns with replacement (the same seeds at every rate: a seed fixes the
split and the batch order), takes the rate with the best mean selection metric over those seeds and the mean target
there. ``resample`` returns, per bootstrap replicate, which configurations were drawn and their targets, so a
statistic over configurations (a rank correlation with a predictor) is computed on all replicates at once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from vitplast_tune.analysis.correlation import numeric, require_columns
from vitplast_tune.components import subset_name


@dataclass
class Runs:
    """Per configuration, its runs as (rates, seeds) arrays of the selection metric and of the target."""

    keys: list[tuple]  # one per configuration, in the order of the arrays
    lrs: list[np.ndarray]
    select: list[np.ndarray]
    target: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.keys)

    def subset(self, mask: np.ndarray) -> Runs:
        """The configurations where ``mask`` is true, in order."""
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
    """Gather the runs of each configuration in ``configs`` from a trial table with ``lr`` and ``seed`` columns.

    A table without a seed column has every run at seed 0.

    Args:
        trials: The trial table.
        configs: The configurations, as tuples of the ``keys`` columns' values (components as subset names).
        keys: The columns that make a configuration.
        select: The metric a rate is chosen by.
        target: The metric reported at the chosen rate.

    Returns:
        Per configuration, its runs as (rates, seeds) arrays of ``select`` and of ``target``.

    Raises:
        UserError: The trial table lacks a column it needs.
    """
    require_columns(trials, [*keys, "lr", select, target])
    frame = pd.DataFrame({k: trials[k].to_numpy() for k in keys})
    if "components" in keys:
        frame["components"] = [subset_name(c) for c in trials["components"]]
    frame["lr"] = numeric(trials["lr"])
    frame["seed"] = trials["seed"].to_numpy() if "seed" in trials else 0
    frame["_select"], frame["_target"] = numeric(trials[select]), numeric(trials[target])
    both = np.isfinite(frame["_select"]) & np.isfinite(frame["_target"])  # as best_lr_table: runs with both only
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
    """The mean target at the rate with the best mean selection metric: ``select`` and ``target`` shaped
    (rates, ..., seeds); a rate without any selection value counts as the worst. Shape: the middle axes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rate or a resample with no finite run: NaN, handled
        chosen = np.nanmean(select, axis=axis_seeds)
        reached = np.nanmean(target, axis=axis_seeds)
    chosen = np.where(np.isnan(chosen), -np.inf, chosen)
    best = np.argmax(chosen, axis=0)
    return np.take_along_axis(reached, best[None], axis=0)[0]


def point_targets(runs: Runs) -> np.ndarray:
    """Each configuration's mean target at its best rate (no resampling)."""
    return np.array([float(best_target(s, t)) for s, t in zip(runs.select, runs.target)])


def resample(runs: Runs, n_boot: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n_boot`` hierarchical resamples: the configurations, then each drawn configuration's seeds.

    Seeded: the same call gives the same resamples.

    Args:
        runs: The runs of each configuration.
        n_boot: How many resamples.
        seed: The seed.

    Returns:
        (drawn, targets), both (n_boot, configurations): ``drawn[b, j]`` the configuration drawn in slot j of
        replicate b, ``targets[b, j]`` its mean target at its best rate on its own draw of seeds (NaN when the drawn
        seeds have none there).
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
