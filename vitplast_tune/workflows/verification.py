"""Check a recommendation with a short grid search."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from vitplast_tune.plan.options import SearchOptions
from vitplast_tune.recommend import verify
from vitplast_tune.recommend.ranking import Recommendation
from vitplast_tune.records.search import Search


def verify_recommendation(
    rec: Recommendation,
    k: int,
    storage: Path,
    *,
    name: str | None = None,
    lrs: Sequence[float] = verify.VERIFY_LRS,
    max_steps: int | None = None,
    cpus_per_trial: float = 1.0,
    verbose: int = 0,
) -> tuple[pd.DataFrame, Search]:
    """Check a recommendation with a short search: its top subsets, full finetuning and the linear probe.

    Args:
        rec: The recommendation.
        k: How many of its top subsets to check.
        storage: Where the search and its space file go.
        name: The search's name, or None for ``recommend-verify-<time>``.
        lrs: The learning rates of the grid.
        max_steps: Training steps per trial, or None for the recommendation's.
        cpus_per_trial: CPUs per trial.
        verbose: Ray Tune's verbosity.

    Returns:
        The verification table and the search's result.
    """
    name = name or f"recommend-verify-{time.strftime('%Y%m%d-%H%M%S')}"
    space = verify.verify_space(rec, k, Path(storage).expanduser() / "recommend", lrs=lrs, max_steps=max_steps)
    options = SearchOptions(
        space=str(space),
        name=name,
        storage=str(storage),
        cpus_per_trial=cpus_per_trial,
        verbose=verbose,
        settings={"seed": rec.settings.seed},
    )
    from vitplast_tune.run import driver

    result = driver.run(options)
    return verify.verification(rec, result.trials, k), result
