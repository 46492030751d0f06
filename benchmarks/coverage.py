"""How many points a BCa interval needs before a verdict can rest on it: the coverage of the analysis's own
intervals on data with a known answer, by sample size.

For each n, ``--reps`` samples from a normal distribution with known correlations, and the 95% intervals the
analysis computes (``analysis.correlation``: ``scipy.stats.bootstrap``, paired, BCa, ``--n-boot`` resamples):

* ``spearman rho=R``: the interval of Spearman's rho of (x, y), bivariate normal with Pearson correlation R;
  the true value is the population Spearman, (6 / pi) * asin(R / 2).
* ``diff R1 vs R2 (R12)``: ``compare_predictors``' interval of the difference Spearman(x1, y) - Spearman(x2, y)
  (the verdict against the baseline), trivariate normal with corr(x1, y) = R1, corr(x2, y) = R2 and
  corr(x1, x2) = R12; the true difference is the difference of the population Spearmans. When R1 = R2 the
  difference is 0 and 1 - coverage is the rate of false "better"/"worse" verdicts.
* ``tied``: the same with x (x1; both x1 and x2 in the null case) cut into 5 levels holding 10, 10, 15, 15 and
  50% of the population, as a subset's ``plasticity_max`` takes one value per component and half the subsets
  share the top one; the true value is the Spearman (mid-ranks) of a sample of 2 million.

Coverage is the share of samples whose interval holds the true value; an undetermined interval (NaN) counts as
not holding it and is also reported. ``MIN_POINTS`` in ``analysis/correlation.py`` is the smallest n of the grid
from which on every scenario's coverage is within ``--tolerance`` of 95% (table in docs/benchmarks.md).

    python -m benchmarks.coverage --json docs/bca_coverage.json
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import pandas as pd

from benchmarks import common
from vitplast_tune.analysis.bootstrap import bca
from vitplast_tune.analysis.correlation import compare_predictors, spearman

SPEARMAN_RHOS = (0.0, 0.5, 0.8)
DIFFS = ((0.8, 0.5, 0.5), (0.6, 0.6, 0.5))  # (R1, R2, R12); the second: no difference
LEVELS = np.array([-1.2816, -0.8416, -0.3853, 0.0])  # normal quantiles 0.1, 0.2, 0.35, 0.5: 5 tied levels


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Sample sizes, replications, resamples, the tolerance and the output file."""
    p = common.parser(__doc__)
    p.add_argument(
        "--ns",
        type=common.at_least(2),
        nargs="+",
        default=[4, 5, 6, 8, 10, 12, 15, 20, 25, 31, 40],
        help="sample sizes",
    )
    p.add_argument(
        "--reps", type=common.at_least(1), default=1000, help="samples per n and scenario (coverage SE ~0.7%% at 1000)"
    )
    p.add_argument(
        "--n-boot",
        type=common.at_least(1),
        default=1000,
        help="bootstrap resamples per interval (trials: 1000, lab 2000)",
    )
    p.add_argument(
        "--tolerance", type=common.at_least(0, float), default=0.05, help="how far below 95%% coverage may fall"
    )
    p.add_argument("--seed", type=common.at_least(0), default=0, help="seed of the samples")
    p.add_argument("--json", type=common.output_path, default=None, help="write the table here")
    return p.parse_args(argv)


def population_spearman(r: float) -> float:
    """Spearman's rho of a bivariate normal with Pearson correlation r."""
    return 6 / math.pi * math.asin(r / 2)


def tie(x: np.ndarray) -> np.ndarray:
    """x cut into the 5 levels of ``LEVELS`` (0..4)."""
    return np.searchsorted(LEVELS, x).astype(float)


def draw(n: int, r1: float, r2: float, r12: float, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """y, x1, x2 from a trivariate normal with corr(x1, y) = r1, corr(x2, y) = r2, corr(x1, x2) = r12."""
    cov = [[1, r1, r2], [r1, 1, r12], [r2, r12, 1]]
    return tuple(rng.multivariate_normal([0, 0, 0], cov, size=n).T)


def truth(r1: float, r2: float, r12: float, ties: tuple[bool, bool]) -> float:
    """Population Spearman(x1, y) - Spearman(x2, y), by formula without ties, else from 2 million draws."""
    if r1 == r2 and ties[0] == ties[1]:
        return 0.0  # x1 and x2 exchangeable
    if not any(ties):
        return population_spearman(r1) - population_spearman(r2)
    y, x1, x2 = draw(2_000_000, r1, r2, r12, np.random.default_rng(12345))
    x1, x2 = (tie(x) if t else x for x, t in zip((x1, x2), ties))
    return spearman(x1, y) - spearman(x2, y)


def spearman_case(n: int, r: float, tied: bool, true: float, rng, n_boot: int) -> tuple[bool, bool]:
    """One sample: (the Spearman interval holds the true value, the interval is undetermined)."""
    y, x, _ = draw(n, r, 0.0, 0.0, rng)
    x = tie(x) if tied else x
    low, high, _ = bca((x, y), spearman, n_boot=n_boot, seed=int(rng.integers(2**31)), vectorized=True)
    if not (np.isfinite(low) and np.isfinite(high)):
        return False, True
    return bool(low <= true <= high), False


def diff_case(n: int, d: tuple, ties: tuple[bool, bool], true: float, rng, n_boot: int) -> tuple[bool, bool]:
    """One sample: (compare_predictors' interval holds the true difference, the interval is undetermined)."""
    y, x1, x2 = draw(n, *d, rng)
    x1, x2 = (tie(x) if t else x for x, t in zip((x1, x2), ties))
    frame = pd.DataFrame({"x1": x1, "x2": x2, "y": y})
    c = compare_predictors(frame, "x1", "x2", "y", n_boot=n_boot, seed=int(rng.integers(2**31)), min_points=0)
    if c["verdict"] == "undetermined":
        return False, True
    return bool(c["diff_low"] <= true <= c["diff_high"]), False


def scenarios() -> list[tuple[str, object]]:
    """Every scenario's name and its one-sample function of (n, rng, n_boot)."""
    cases: list[tuple[str, object]] = []
    for r, tied in [(r, False) for r in SPEARMAN_RHOS] + [(0.8, True)]:
        true = truth(r, 0.0, 0.0, (tied, False))
        name = f"spearman rho={r:g}" + (" tied" if tied else "")
        cases.append((name, lambda n, rng, b, a=(r, tied, true): spearman_case(n, *a, rng, b)))
    for d, ties in [(d, (False, False)) for d in DIFFS] + [
        ((0.8, 0.6, 0.5), (True, False)),
        ((0.7, 0.7, 0.5), (True, True)),
    ]:
        true = truth(*d, ties)
        name = f"diff {d[0]:g} vs {d[1]:g} ({d[2]:g})" + (" tied" if any(ties) else "")
        cases.append((name, lambda n, rng, b, a=(d, ties, true): diff_case(n, *a, rng, b)))
    return cases


def threshold(rows: list[dict], tolerance: float) -> int | None:
    """The smallest n from which on every scenario's coverage is at least 95% - tolerance (None: no such n)."""
    table = pd.DataFrame(rows).pivot(index="n", columns="scenario", values="coverage").sort_index()
    ok = (table >= 0.95 - tolerance).all(axis=1)
    for n in table.index:
        if ok.loc[n:].all():
            return int(n)
    return None


def main(argv: list[str] | None = None) -> None:
    """Run every n and scenario, print a markdown table and the threshold, write the JSON."""
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    rows, cases = [], scenarios()
    for n in args.ns:
        for name, case in cases:
            started = time.perf_counter()
            results = [case(n, rng, args.n_boot) for _ in range(args.reps)]
            covered, undetermined = (np.mean([r[i] for r in results]) for i in (0, 1))
            rows.append({"n": n, "scenario": name, "coverage": float(covered), "undetermined": float(undetermined)})
            print(
                f"n={n:<3} {name:<24} coverage {100 * covered:5.1f}%  undetermined {100 * undetermined:4.1f}%"
                f"  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
            common.write_json(args.json, {"args": vars(args), "rows": rows})  # after each cell
    table = pd.DataFrame(rows)
    wide = table.pivot(index="n", columns="scenario", values="coverage")
    header = "| n | " + " | ".join(wide.columns) + " |"
    print("\n".join([header, "|---" * (len(wide.columns) + 1) + "|"]))
    for n, row in wide.iterrows():
        print(f"| {n} | " + " | ".join(f"{100 * v:.1f}%" for v in row) + " |")
    print(
        f"smallest n with every coverage >= {100 * (0.95 - args.tolerance):.1f}% from there on: "
        f"{threshold(rows, args.tolerance)}"
    )


if __name__ == "__main__":
    main()
