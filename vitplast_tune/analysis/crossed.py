"""Resample a lab's seeds and test images once per resample and share the draw across every subset."""

from __future__ import annotations

import warnings
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from vitplast_tune.analysis.correlation import _numeric
from vitplast_tune.components import subset_name

CHUNK = 1000  # resamples per step; memory grows as subsets x rates x CHUNK x seeds


@dataclass
class Grid:
    """Hold a lab's runs as arrays indexed by subset, rate and seed, with index -1 for a missing run."""

    keys: list[str]
    select: np.ndarray  # (subsets, rates, seeds)
    run: np.ndarray  # (subsets, rates, seeds) int
    test: np.ndarray  # (runs,) recorded test accuracy
    correct: np.ndarray | None = None  # (runs, test images) 0/1 outcomes, or None when the lab kept none
    seeds: tuple = ()

    def __len__(self) -> int:
        return len(self.keys)

    def rows(self, keys: list[str]) -> Grid:
        """Return the grid of the subsets ``keys`` only, in that order."""
        at = [self.keys.index(k) for k in keys]
        return Grid(list(keys), self.select[at], self.run[at], self.test, self.correct, self.seeds)


def grid_of(
    trials: pd.DataFrame,
    keys: list[str],
    *,
    select: str,
    target: str = "test_acc",
    correct: np.ndarray | None = None,
) -> Grid:
    """Build the grid of the subsets ``keys`` from a trial table and optional per-image outcomes per row."""
    names = np.array([subset_name(c) for c in trials["components"]])
    sel, tgt = _numeric(trials[select]), _numeric(trials[target])
    ok = np.isfinite(sel) & np.isfinite(tgt)
    seeds = tuple(sorted(pd.unique(trials.loc[ok, "seed"])))
    rates = [sorted(set(_numeric(trials.loc[ok & (names == k), "lr"]))) for k in keys]
    width = max((len(r) for r in rates), default=1)
    shape = (len(keys), width, len(seeds))
    grid_select, grid_run = np.full(shape, np.nan), np.full(shape, -1, dtype=int)
    lrs, seed_col = _numeric(trials["lr"]), trials["seed"].to_numpy()
    for j, key in enumerate(keys):
        for i in np.flatnonzero(ok & (names == key)):
            r, s = rates[j].index(lrs[i]), seeds.index(seed_col[i])
            grid_select[j, r, s], grid_run[j, r, s] = sel[i], i
    return Grid(list(keys), grid_select, grid_run, tgt, correct, seeds)


def stream(name: str, seed: int) -> np.random.Generator:
    """Seed a lab's random stream from the bootstrap seed and the lab's name, so that no two labs share one."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode())])


def targets(grid: Grid, n_boot: int, rng: np.random.Generator, *, draw_subsets: bool) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n_boot`` crossed resamples and return the drawn subsets and their accuracies at their best rates."""
    n, n_seeds = len(grid), grid.select.shape[2]
    drawn = rng.integers(0, n, size=(n_boot, n)) if draw_subsets else np.broadcast_to(np.arange(n), (n_boot, n))
    values = np.empty((n_boot, n))
    for start in range(0, n_boot, CHUNK):
        b = min(CHUNK, n_boot - start)
        columns = rng.integers(0, n_seeds, size=(b, n_seeds))
        scores, images = _run_scores(grid, b, rng)  # (b, runs)
        per_subset = _best_rate_means(grid, columns, scores) / images  # (subsets, b)
        values[start : start + b] = np.take_along_axis(per_subset.T, drawn[start : start + b], axis=1)
    return np.array(drawn), values


def _run_scores(grid: Grid, b: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Score each run on ``b`` draws of the test images and return the divisor that turns a score into accuracy."""
    if grid.correct is None:
        return np.broadcast_to(grid.test, (b, len(grid.test))), 1
    images = grid.correct.shape[1]
    counts = rng.multinomial(images, np.full(images, 1 / images), size=b).astype(np.float32)
    # Whole counts of correct images make equal means tie exactly; float32 sums stay exact below 2^24.
    return (counts @ grid.correct.T.astype(np.float32)).astype(np.float64), images


def _best_rate_means(grid: Grid, columns: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Return each subset's mean score over the drawn seeds at its best rate, shaped (subsets, b)."""
    sel = grid.select[:, :, columns]  # (subsets, rates, b, seeds)
    runs = grid.run[:, :, columns]
    b_index = np.arange(len(columns))[None, None, :, None]
    got = np.where(runs >= 0, scores[b_index, np.maximum(runs, 0)], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rate without a run on the drawn seeds gives NaN
        chosen = np.nanmean(sel, axis=3)
        reached = np.nanmean(got, axis=3)  # (subsets, rates, b)
    best = np.argmax(np.where(np.isnan(chosen), -np.inf, chosen), axis=1)  # (subsets, b)
    return np.take_along_axis(reached, best[:, None, :], axis=1)[:, 0, :]


def point(grid: Grid) -> np.ndarray:
    """Return each subset's mean test accuracy at its best rate over all its seeds, without resampling."""
    columns = np.arange(grid.select.shape[2])[None, :]
    if grid.correct is None:
        return _best_rate_means(grid, columns, grid.test[None, :])[:, 0]
    hits = grid.correct.sum(axis=1, dtype=np.int64).astype(np.float64)
    return _best_rate_means(grid, columns, hits[None, :])[:, 0] / grid.correct.shape[1]
