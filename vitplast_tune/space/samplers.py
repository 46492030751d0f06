"""The Optuna samplers a space file may name (``sampler: tpe``), in one registry that the search and the replay
benchmark share.

Each entry builds a seeded sampler and says why it cannot search a space, if it cannot. Adding a sampler is one
``register`` call. Optuna is imported only when a sampler is built.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vitplast_tune.components import COMPONENTS, component_flag, method_flag
from vitplast_tune.errors import SpaceError, did_you_mean
from vitplast_tune.space.distributions import Choice, Distribution, Methods, Subsets

if TYPE_CHECKING:
    from optuna.samplers import BaseSampler

Parameters = Mapping[str, Distribution]
DEFAULT = "tpe"


def _can_search(parameters: Parameters, multi_objective: bool) -> str | None:
    return None


@dataclass(frozen=True)
class Sampler:
    """One registered sampler.

    Attributes:
        build: Makes the Optuna sampler from a seed and the space's parameters.
        refuse: Says why the sampler cannot search a space (its parameters, several objectives); None when it can.
        words: What the sampler is, in a few words, for the documentation and messages.
    """

    build: Callable[[int, Parameters], BaseSampler]
    refuse: Callable[[Parameters, bool], str | None] = _can_search
    words: str = ""


SAMPLERS: dict[str, Sampler] = {}


def register(name: str, sampler: Sampler) -> None:
    """Add a sampler to the registry, so that space files may name it.

    Args:
        name: The name a space file gives as ``sampler:``.
        sampler: How to build it, and what it refuses.
    """
    SAMPLERS[name] = sampler


def check_sampler(name: str, algorithm: str, parameters: Parameters, multi_objective: bool, where: str) -> None:
    """Check that a space's sampler is registered and can search the space.

    Args:
        name: The sampler's name.
        algorithm: The space's algorithm: a sampler other than the default needs ``optuna``.
        parameters: The space's parameters.
        multi_objective: Whether the search has several objectives.
        where: The space file, for messages.

    Raises:
        UserError: If the name is unknown, the algorithm is not ``optuna``, or the sampler cannot search the space.
    """
    if name not in SAMPLERS:
        known = ", ".join(SAMPLERS)
        raise SpaceError(f'{where}: unknown sampler "{name}"{did_you_mean(name, SAMPLERS)}; use one of {known}')
    if name != DEFAULT and algorithm != "optuna":
        raise SpaceError(f"{where}: sampler {name} needs algorithm: optuna, not {algorithm}")
    reason = SAMPLERS[name].refuse(parameters, multi_objective)
    if reason:
        raise SpaceError(f"{where}: sampler {name} {reason}")


def make_sampler(name: str, seed: int, parameters: Parameters | None = None) -> BaseSampler:
    """Build a registered sampler, seeded.

    Args:
        name: The sampler's name.
        seed: Its seed.
        parameters: The space's parameters (the grid sampler builds its grid from them).

    Returns:
        The Optuna sampler.
    """
    import optuna

    with warnings.catch_warnings():  # the user chose the sampler: Optuna's "experimental" notes say nothing more
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return SAMPLERS[name].build(seed, parameters or {})


def _optuna(cls: str, **options: Any) -> Callable[[int, Parameters], BaseSampler]:
    """A builder of Optuna's sampler class ``cls`` with ``options`` and the seed."""

    def build(seed: int, parameters: Parameters) -> BaseSampler:
        import optuna

        return getattr(optuna.samplers, cls)(seed=seed, **options)

    return build


def _categorical(parameters: Parameters) -> list[str]:
    """The parameters Optuna asks as a category (more than one value)."""
    return [
        p.name
        for p in parameters.values()
        if isinstance(p, (Subsets, Methods)) or (isinstance(p, Choice) and len(p.values) > 1)
    ]


def _refuse_cmaes(parameters: Parameters, multi_objective: bool) -> str | None:
    if multi_objective:
        return "optimises one objective; use tpe or gp for several"
    names = _categorical(parameters)
    if names:
        return f"needs numbers, and {', '.join(names)} is a category; use a range or a constant, or tpe or gp"
    return None


def _grid_axes(parameters: Parameters) -> dict[str, list]:
    """The values of each name that Optuna asks, for its grid sampler."""
    axes: dict[str, list] = {}
    for p in parameters.values():
        if isinstance(p, Subsets):
            axes |= {component_flag(c): [True, False] for c in COMPONENTS}
        elif isinstance(p, Methods):
            axes |= {method_flag(c): list(options) for c, options in p.choices if len(options) > 1}
        elif isinstance(p, Choice):
            axes[p.name] = list(p.values)
    return axes


def _refuse_grid(parameters: Parameters, multi_objective: bool) -> str | None:
    ranges = [p.name for p in parameters.values() if not p.discrete]
    return f"needs discrete parameters, and {', '.join(ranges)} is a range; write {{choice: [...]}}" if ranges else None


def _grid(seed: int, parameters: Parameters) -> BaseSampler:
    from optuna.samplers import GridSampler

    sampler = GridSampler(_grid_axes(parameters), seed=seed)
    sampler.after_trial = _after_grid_trial  # type: ignore[method-assign]  # a module's function: it pickles
    return sampler


def _after_grid_trial(study: Any, trial: Any, state: Any, values: Any) -> None:
    """Do nothing after a grid trial: Optuna's grid sampler calls ``study.stop()`` once its grid is tried, which only
    ``study.optimize`` allows (Ray asks and tells); it then tries the grid's points again."""


register("tpe", Sampler(_optuna("TPESampler"), words="Optuna's TPE, the default"))
register(
    "tpe-multivariate",
    Sampler(_optuna("TPESampler", multivariate=True, group=True), words="TPE over the parameters jointly"),
)
register(
    "gp",
    Sampler(_optuna("GPSampler", warn_independent_sampling=False), words="a Gaussian process (torch in the driver)"),
)
register("cmaes", Sampler(_optuna("CmaEsSampler"), _refuse_cmaes, "CMA-ES, for numeric parameters only"))
register("random", Sampler(_optuna("RandomSampler"), words="uniformly at random"))
register(
    "qmc",
    Sampler(
        _optuna("QMCSampler", scramble=True, warn_independent_sampling=False),
        words="a scrambled Sobol sequence (categories at random)",
    ),
)
register("grid", Sampler(_grid, _refuse_grid, "every combination of the choices, in random order"))
