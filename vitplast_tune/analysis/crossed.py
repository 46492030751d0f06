"""The crossed bootstrap of a lab: seeds and test images drawn once per resample and shared by every subset.

A lab's seed is a crossed factor (seed s fixes the validation split and the batch order for every subset), and every
subset is scored on the same test images, so a resample draws one set of seed columns and one multiset of test images
and applies them to every subset alike; the subsets themselves may be drawn too (the 31-subset statistic) or kept (the
single components). Within a resample each subset's rate is chosen again on its mean validation accuracy over the
drawn seeds, and its target is the mean test accuracy over those seeds at that rate, on the drawn test images when the
lab kept each trial's per-image outcomes (``test_correct.csv``), else on the recorded test accuracy.
"""

from __future__ import annotations

import warnings
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from vitplast_tune.analysis.correlation import numeric
from vitplast_tune.components import subset_name

CHUNK = 1000  # resamples computed at once: (subsets x rates x CHUNK x seeds) floats


@dataclass
class Grid:
    """A lab's runs as arrays: per subset (rows) and rate (padded), per seed (the lab's seeds, shared columns), the
    selection metric and the run's index into ``test`` / ``correct`` (-1 where a run is missing)."""

    keys: list[str]
    select: np.ndarray  # (subsets, rates, seeds)
    run: np.ndarray  # (subsets, rates, seeds) int
    test: np.ndarray  # (runs,) recorded test accuracy
    correct: np.ndarray | None = None  # (runs, test images) 0/1 outcomes, or None when the lab kept none
    seeds: tuple = ()

    def __len__(self) -> int:
        return len(self.keys)

    def rows(self, keys: list[str]) -> Grid:
        """The grid of the subsets ``keys`` only, in that order."""
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
    """The runs of the subsets ``keys`` from a trial table (``components``, ``lr``, ``seed``, ``select``, ``target``);
    ``correct``: per-image outcomes aligned with the table's rows (None: resample seeds only). A run without both
    metrics counts as missing."""
    names = np.array([subset_name(c) for c in trials["components"]])
    sel, tgt = numeric(trials[select]), numeric(trials[target])
    ok = np.isfinite(sel) & np.isfinite(tgt)
    seeds = tuple(sorted(pd.unique(trials.loc[ok, "seed"])))
    rates = [sorted(set(numeric(trials.loc[ok & (names == k), "lr"]))) for k in keys]
    width = max((len(r) for r in rates), default=1)
    shape = (len(keys), width, len(seeds))
    grid_select, grid_run = np.full(shape, np.nan), np.full(shape, -1, dtype=int)
    lrs, seed_col = numeric(trials["lr"]), trials["seed"].to_numpy()
    for j, key in enumerate(keys):
        for i in np.flatnonzero(ok & (names == key)):
            r, s = rates[j].index(lrs[i]), seeds.index(seed_col[i])
            grid_select[j, r, s], grid_run[j, r, s] = sel[i], i
    return Grid(list(keys), grid_select, grid_run, tgt, correct, seeds)


def stream(name: str, seed: int) -> np.random.Generator:
    """The random stream of a lab's resamples: from the bootstrap seed and the lab's name, so the labs' order changes
    nothing and two labs never share a stream."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode())])


def targets(grid: Grid, n_boot: int, rng: np.random.Generator, *, draw_subsets: bool) -> tuple[np.ndarray, np.ndarray]:
    """``n_boot`` crossed resamples: (drawn, values), both (n_boot, subsets): ``drawn[b, j]`` the subset in slot j of
    resample b (the identity without ``draw_subsets``) and ``values[b, j]`` its mean test accuracy at its best rate on
    that resample's seeds and test images (NaN where the drawn seeds have no run there)."""
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
    """Each run's score on each of ``b`` draws of the test images and what divides a mean of them into an accuracy:
    its correct images (whole numbers, so subsets whose means are equal tie exactly, ranked as ``scipy`` ranks ties)
    and the number of images; the recorded accuracy and 1 without outcomes."""
    if grid.correct is None:
        return np.broadcast_to(grid.test, (b, len(grid.test))), 1
    images = grid.correct.shape[1]
    counts = rng.multinomial(images, np.full(images, 1 / images), size=b).astype(np.float32)
    return (counts @ grid.correct.T.astype(np.float32)).astype(np.float64), images  # exact: sums below 2^24


def _best_rate_means(grid: Grid, columns: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """(subsets, b): per subset and resample, the mean score over the drawn seed ``columns`` at the rate with the best
    mean selection metric over them."""
    sel = grid.select[:, :, columns]  # (subsets, rates, b, seeds)
    runs = grid.run[:, :, columns]
    b_index = np.arange(len(columns))[None, None, :, None]
    got = np.where(runs >= 0, scores[b_index, np.maximum(runs, 0)], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rate without a run on the drawn seeds: NaN, handled
        chosen = np.nanmean(sel, axis=3)
        reached = np.nanmean(got, axis=3)  # (subsets, rates, b)
    best = np.argmax(np.where(np.isnan(chosen), -np.inf, chosen), axis=1)  # (subsets, b)
    return np.take_along_axis(reached, best[:, None, :], axis=1)[:, 0, :]


def point(grid: Grid) -> np.ndarray:
    """Each subset's mean test accuracy at its best rate over all its seeds (no resampling): from its correct images
    where the lab kept them (equal means tie exactly), else from the recorded accuracy."""
    columns = np.arange(grid.select.shape[2])[None, :]
    if grid.correct is None:
        return _best_rate_means(grid, columns, grid.test[None, :])[:, 0]
    hits = grid.correct.sum(axis=1, dtype=np.int64).astype(np.float64)
    return _best_rate_means(grid, columns, hits[None, :])[:, 0] / grid.correct.shape[1]
