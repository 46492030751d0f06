"""The space's early-stopping rule as a Ray Tune scheduler over training steps: ASHA, median stopping, or none."""

from __future__ import annotations

from vitplast_tune.space.files import SearchSpec


def scheduler(spec: SearchSpec, max_steps: int):
    """ASHA (grace period, reduction factor, up to ``max_steps``), median stopping, or FIFO (no early stopping)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

    s = spec.scheduler
    if s.name == "asha":
        return ASHAScheduler(
            time_attr="step", max_t=max_steps, grace_period=s.grace_period, reduction_factor=s.reduction_factor
        )
    if s.name == "median":
        return MedianStoppingRule(time_attr="step", grace_period=s.grace_period)
    return FIFOScheduler()
