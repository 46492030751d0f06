"""A recommendation checked with a short search (the grid of ``recommend.verify.verify_space``)."""

from __future__ import annotations

import time
from pathlib import Path

from vitplast_tune.plan.options import SearchOptions
from vitplast_tune.recommend import verify
from vitplast_tune.recommend.ranking import Recommendation


def verify_recommendation(
    rec: Recommendation,
    k: int,
    storage: Path,
    *,
    name: str | None = None,
    lrs=verify.VERIFY_LRS,
    max_steps: int | None = None,
    cpus_per_trial: float = 1.0,
    verbose: int = 0,
):
    """Check a recommendation with a short search: the grid of ``recommend.verify.verify_space`` run under ``storage``;
    return ``verification``'s table and the search's ``SearchResult``."""
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
