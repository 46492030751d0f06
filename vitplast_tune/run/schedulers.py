"""Build the space's early-stopping rule as a Ray Tune scheduler over training steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitplast_tune.space.files import SearchSpec

if TYPE_CHECKING:
    from ray.tune.schedulers import TrialScheduler


def scheduler(spec: SearchSpec, max_steps: int) -> TrialScheduler:
    """Make the space's trial scheduler: ASHA, median stopping, or FIFO.

    Args:
        spec: The space.
        max_steps: The trial budget, ASHA's longest rung.

    Returns:
        Ray Tune's scheduler; ASHA and median stopping pass over the finalists.
    """
    from ray.tune.schedulers import FIFOScheduler

    from vitplast_tune.run.finalists import SparingASHA, SparingMedian

    s = spec.scheduler
    if s.name == "asha":
        return SparingASHA(
            time_attr="step", max_t=max_steps, grace_period=s.grace_period, reduction_factor=s.reduction_factor
        )
    if s.name == "median":
        return SparingMedian(time_attr="step", grace_period=s.grace_period)
    return FIFOScheduler()
