"""Run grid and random spaces with Tune's variant generator."""

from __future__ import annotations

from typing import Any

from vitplast_tune.space.distributions import Choice, Constant, Distribution, LogUniform, RandInt, Uniform
from vitplast_tune.space.files import SearchSpec


def _tune_domain(p: Distribution) -> Any:
    """Return the Ray Tune sampling domain of a parameter."""
    from ray import tune

    if isinstance(p, Constant):
        return p.value
    if isinstance(p, LogUniform):
        return tune.loguniform(p.low, p.high)
    if isinstance(p, Uniform):
        return tune.uniform(p.low, p.high)
    if isinstance(p, RandInt):
        return tune.randint(p.low, p.high + 1)
    return tune.choice(list(p.values) if isinstance(p, Choice) else p.grid_values())


def tune_param_space(spec: SearchSpec) -> dict[str, Any]:
    """Return the Ray Tune param_space of a grid or random space."""
    from ray import tune

    def domain(p: Distribution) -> Any:
        if isinstance(p, Constant):
            return p.value
        return tune.grid_search(p.grid_values()) if spec.algorithm == "grid" else _tune_domain(p)

    space = {name: domain(p) for name, p in spec.parameters.items()}
    if spec.budgets:  # the grid itself comes as the search algorithm's points (``grid_points``): one trial each
        space["max_steps"] = tune.grid_search([b.steps for b in spec.budgets])
    return space


def grid_points(spec: SearchSpec) -> list[dict[str, Any]] | None:
    """List a grid with budgets as explicit configurations, one trial each; None for other spaces."""
    return spec.grid * spec.num_samples if spec.budgets and spec.algorithm == "grid" else None


def _variant_generator(spec: SearchSpec, seed: int, max_concurrent: int | None = None):
    """Build Tune's seeded variant generator for a grid or random space."""
    from ray.tune.search import BasicVariantGenerator

    return BasicVariantGenerator(
        random_state=seed, max_concurrent=max_concurrent or 0, points_to_evaluate=grid_points(spec)
    )
