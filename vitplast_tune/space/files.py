"""Read and validate search-space files into a ``SearchSpec``; docs/guide/spaces.md describes their keys."""

from __future__ import annotations

import hashlib
import importlib.resources
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vitplast_tune.errors import SpaceError, did_you_mean
from vitplast_tune.space import samplers
from vitplast_tune.space.baselines import _parse_baselines, references
from vitplast_tune.space.distributions import Constant, Distribution, Subsets, parse_param
from vitplast_tune.space.finalists import OFF, Finalists, _parse_finalists
from vitplast_tune.space.reading import _read_yaml
from vitplast_tune.type_checks import checked

SHIPPED = "vitplast_tune.search_spaces"  # the repository's search_spaces/, installed under this name (pyproject.toml)


def spaces_dir() -> Path:
    """Find the folder of the shipped space files.

    Returns:
        ``search_spaces/``, installed as the package ``SHIPPED``.
    """
    try:
        return Path(str(importlib.resources.files(SHIPPED)))
    except ModuleNotFoundError:  # a source checkout on sys.path without an install
        return Path(__file__).resolve().parents[2] / "search_spaces"


ALGORITHMS = ("optuna", "grid", "random")
SCHEDULERS = ("asha", "median", "fifo")
MODES = ("max", "min")
_TOP_KEYS = ("description", "metric", "mode", "algorithm", "sampler", "num_samples", "scheduler", "criteria")
_TOP_KEYS += ("max_trainable_params", "warm_start", "budgets", "finalists", "baselines", "parameters", "defaults")
_SCHEDULER_KEYS = ("name", "grace_period", "reduction_factor")


@dataclass(frozen=True)
class SchedulerSpec:
    """Say how trials stop early: ``asha`` with its grace period and reduction factor, ``median`` or ``fifo``."""

    name: str = "fifo"
    grace_period: int = 100
    reduction_factor: int = 3


@dataclass(frozen=True)
class Budget:
    """Hold one step budget of a grid: its steps, and the parameters it narrows to fewer choices."""

    steps: int
    narrowed: dict[str, Distribution] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchSpec:
    """Hold a validated space file.

    Attributes:
        name: The file's name without its suffix.
        path: Where it was read from.
        description: Its ``description``.
        metric: The metric to optimise; the first of several objectives.
        mode: ``max`` or ``min``, the first metric's.
        algorithm: ``optuna``, ``grid`` or ``random``.
        sampler: Optuna's sampler, by its name in ``space.samplers``.
        num_samples: Trials; for a grid, repeats of the whole grid.
        scheduler: The early stopping.
        parameters: What each trial gets, by name.
        defaults: Experiment settings, which command-line flags override.
        text: The file's content.
        criteria: Whether the criteria lab compares the predictors per subset at the end.
        objectives: The (metric, mode) of each objective; two or more make a multi-objective search.
        max_trainable_params: The parameter budget; trials over it are not trained.
        warm_start: How many recommended subsets TPE tries first.
        budgets: The step budgets of a grid run at several.
        finalists: The finalists stage after the search's trials.
        baselines: How many rates each baseline trains at as a reference trial.
    """

    name: str
    path: Path
    description: str
    metric: str
    mode: str
    algorithm: str
    num_samples: int
    scheduler: SchedulerSpec
    parameters: dict[str, Distribution]
    defaults: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    criteria: bool = False
    objectives: tuple[tuple[str, str], ...] = ()
    max_trainable_params: int | None = None
    warm_start: int = 0
    budgets: tuple[Budget, ...] = ()
    finalists: Finalists = OFF
    baselines: int = 0
    sampler: str = samplers.DEFAULT

    @property
    def multi_objective(self) -> bool:
        """Tell whether Optuna optimises several objectives."""
        return len(self.objectives) > 1

    @property
    def has_seeds(self) -> bool:
        """Tell whether trials repeat over seeds, so the paper's protocol applies."""
        seed = self.parameters.get("seed")
        return seed is not None and not isinstance(seed, Constant)

    @property
    def budget_steps(self) -> tuple[int, ...]:
        """Return the step count of each budget."""
        return tuple(b.steps for b in self.budgets)

    @property
    def fingerprint(self) -> str:
        """Hash the file's content; a resumed search must use the same space."""
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]

    @property
    def grid(self) -> list[dict[str, Any]]:
        """List every configuration of a grid space in file order, each budget's grid in turn."""
        names = list(self.parameters)
        if not self.budgets:
            return [dict(zip(names, combo)) for combo in itertools.product(*self._axes(self.parameters))]
        grid = []
        for budget in self.budgets:
            axes = self._axes({**self.parameters, **budget.narrowed})
            grid += [{**dict(zip(names, combo)), "max_steps": budget.steps} for combo in itertools.product(*axes)]
        return grid

    @staticmethod
    def _axes(parameters: dict[str, Distribution]) -> list[list]:
        return [p.grid_values() for p in parameters.values()]

    @property
    def total_trials(self) -> int:
        """Count the trials this space runs before any finalists."""
        return (
            len(self.grid) * self.num_samples
            if self.algorithm == "grid"
            else self.num_samples + len(references(self.parameters, self.baselines))
        )

    def example(self) -> dict[str, Any]:
        """Make one representative configuration, for validating settings.

        Returns:
            The first corner of each parameter, and the first budget's ``max_steps``.
        """
        steps = {"max_steps": self.budgets[0].steps} if self.budgets else {}
        return {**{name: p.corners()[0] for name, p in self.parameters.items()}, **steps}

    def corner_configs(self) -> list[dict[str, Any]]:
        """Make configurations that touch every choice, both ends of every range, and every budget.

        Returns:
            The configurations, ``example`` first.
        """
        base = self.example()
        budgets = [{**base, "max_steps": b.steps} for b in self.budgets[1:]]
        return [base] + [{**base, name: v} for name, p in self.parameters.items() for v in p.corners()[1:]] + budgets

    def with_overrides(self, num_samples: int | None = None, budgets: Sequence[int] | None = None) -> SearchSpec:
        """Apply the command line's ``--num-samples`` and ``--budgets`` to a validated copy.

        Args:
            num_samples: The trials in place of the file's; None keeps them.
            budgets: Step counts that replace the budgets' steps in order; one more trains the whole grid.

        Returns:
            The copy, or ``self`` when nothing changes.
        """
        spec = self
        if num_samples is not None:
            if num_samples < 1:
                raise SpaceError(f"--num-samples must be at least 1, got {num_samples}")
            spec = replace(spec, num_samples=num_samples)
        if budgets is not None:
            narrowed = [b.narrowed for b in self.budgets]
            entries = [{"steps": s, **(narrowed[i] if i < len(narrowed) else {})} for i, s in enumerate(budgets)]
            entries = [{k: v.grid_values() if k != "steps" else v for k, v in e.items()} for e in entries]
            spec = replace(spec, budgets=_parse_budgets(entries, self.parameters, f"{self.path} with --budgets"))
        if spec is not self:
            _check_algorithm(spec)
        return spec


def _resolve_space_path(name_or_path: str | Path) -> Path:
    """Find a space file by path, else by name among the shipped ones."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    for candidate in (
        spaces_dir() / f"{name_or_path}.yaml",
        spaces_dir() / f"{name_or_path}.yml",
        spaces_dir() / str(name_or_path),
    ):
        if candidate.is_file():
            return candidate
    known = list_spaces()
    raise SpaceError(
        f'search space "{name_or_path}" not found{did_you_mean(str(name_or_path), known)}; known: {", ".join(known)}, or a path to a .yaml file'
    )


def list_spaces() -> list[str]:
    """List the names of the space files shipped with the package.

    Returns:
        The names, sorted, without the ``.yaml`` suffix.
    """
    return sorted(p.stem for p in spaces_dir().glob("*.yaml"))


@checked()
def load_space(name_or_path: str | Path) -> SearchSpec:
    """Read and validate a space file.

    Args:
        name_or_path: A path to a YAML file, else the name of a shipped space.

    Returns:
        The validated space.
    """
    path = _resolve_space_path(name_or_path)
    raw, text = _read_yaml(path, "space file", SpaceError)
    where = str(path)
    if not isinstance(raw, dict):
        raise SpaceError(f"{where}: a space file is a YAML mapping with keys {', '.join(_TOP_KEYS)}")
    _check_keys(raw, _TOP_KEYS, where, "key")
    parameters = raw.get("parameters") or {}
    if not isinstance(parameters, dict) or not parameters:
        raise SpaceError(f"{where}: needs a non-empty 'parameters' mapping")
    defaults = raw.get("defaults") or {}
    objectives = _parse_objectives(raw, where)
    if not isinstance(defaults, dict):
        raise SpaceError(f"{where}: 'defaults' must be a mapping of settings")
    spec = SearchSpec(
        name=path.stem,
        path=path,
        description=str(raw.get("description", "")).strip(),
        metric=objectives[0][0],
        mode=objectives[0][1],
        algorithm=_one_of(raw.get("algorithm", "optuna"), ALGORITHMS, where, "algorithm"),
        sampler=str(raw.get("sampler", samplers.DEFAULT)),
        num_samples=_positive_int(raw.get("num_samples", 1), where, "num_samples"),
        scheduler=_parse_scheduler(raw.get("scheduler", "fifo"), where),
        parameters={str(k): parse_param(str(k), v, where) for k, v in parameters.items()},
        defaults=dict(defaults),
        text=text,
        criteria=_flag(raw.get("criteria", False), where, "criteria"),
        objectives=objectives,
        max_trainable_params=None
        if (most := raw.get("max_trainable_params")) is None
        else _positive_int(most, where, "max_trainable_params"),
        warm_start=_positive_int(raw.get("warm_start", 0), where, "warm_start", minimum=0),
        finalists=_parse_finalists(raw.get("finalists"), where),
    )
    spec = replace(spec, budgets=_parse_budgets(raw.get("budgets"), spec.parameters, where))
    spec = replace(
        spec, baselines=_parse_baselines(raw.get("baselines"), spec.algorithm, spec.parameters, spec.num_samples, where)
    )
    _check_algorithm(spec)
    return spec


def _parse_objectives(raw: dict, where: str) -> tuple[tuple[str, str], ...]:
    """Read ``metric`` and ``mode``: one of each, or two lists of the same length."""
    metric, mode = raw.get("metric", "val_acc"), raw.get("mode", "max")
    if not isinstance(metric, list):
        return ((str(metric), _one_of(mode, MODES, where, "mode")),)
    if not isinstance(mode, list) or len(mode) != len(metric) or len(metric) < 2:
        raise SpaceError(
            f"{where}: two or more objectives need metric and mode lists of the same length, "
            f"e.g. metric: [val_acc, trainable_params] and mode: [max, min]"
        )
    if len(set(map(str, metric))) < len(metric):
        raise SpaceError(f"{where}: metric lists an objective twice ({', '.join(map(str, metric))}); name each once")
    return tuple((str(m), _one_of(d, MODES, where, "mode")) for m, d in zip(metric, mode))


_BUDGETS_FORM = "a list of step counts, or of {steps: N, PARAMETER: [fewer of its choices]}"


def _parse_budgets(raw: Any, parameters: dict[str, Distribution], where: str) -> tuple[Budget, ...]:
    """Read a space file's ``budgets``: step counts, each with the parameters it narrows."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise SpaceError(f"{where}: budgets must be {_BUDGETS_FORM}, e.g. [150, {{steps: 600, lr: [0.1]}}]")
    if "max_steps" in parameters:
        raise SpaceError(f"{where}: budgets set each trial's max_steps; remove max_steps from parameters")
    budgets = [_parse_budget(entry, parameters, where) for entry in raw]
    steps = [b.steps for b in budgets]
    if len(set(steps)) != len(steps):
        raise SpaceError(f"{where}: budgets {steps} repeat a step count; give each budget once")
    return tuple(budgets)


def _parse_budget(entry: Any, parameters: dict[str, Distribution], where: str) -> Budget:
    if not isinstance(entry, dict):
        return Budget(_positive_int(entry, where, "a budget's steps"))
    if "steps" not in entry:
        raise SpaceError(f"{where}: budget {entry} has no steps; write {_BUDGETS_FORM}")
    narrowed = {}
    for name, values in entry.items():
        if name == "steps":
            continue
        if name not in parameters:
            raise SpaceError(
                f'{where}: budget {entry["steps"]} narrows "{name}", which is not a parameter'
                f"{did_you_mean(str(name), parameters)}; parameters: {', '.join(parameters)}"
            )
        narrowed[name] = parse_param(name, {"choice": values}, where)
        extra = [v for v in narrowed[name].grid_values() if v not in parameters[name].grid_values()]
        if extra:
            raise SpaceError(
                f'{where}: budget {entry["steps"]} gives "{name}" {extra}, not among its choices '
                f"{parameters[name].grid_values()}; a budget only narrows a parameter"
            )
    return Budget(_positive_int(entry["steps"], where, "a budget's steps"), narrowed)


def _check_algorithm(spec: SearchSpec) -> None:
    samplers._check_sampler(spec.sampler, spec.algorithm, spec.parameters, spec.multi_objective, str(spec.path))
    if spec.multi_objective and spec.algorithm != "optuna":
        raise SpaceError(f"{spec.path}: several objectives need algorithm: optuna (its multi-objective TPE)")
    if spec.multi_objective and spec.scheduler.name != "fifo":
        raise SpaceError(
            f"{spec.path}: scheduler {spec.scheduler.name} stops trials by one metric; with several "
            "objectives use scheduler: fifo (every trial trains its whole budget)"
        )
    if spec.warm_start and not (spec.algorithm == "optuna" and isinstance(spec.parameters.get("components"), Subsets)):
        raise SpaceError(f"{spec.path}: warm_start needs algorithm: optuna and components: {{subsets: ...}}")
    if spec.budgets and (spec.algorithm != "grid" or spec.scheduler.name != "fifo"):
        raise SpaceError(
            f"{spec.path}: budgets need algorithm: grid and scheduler: fifo (every trial trains its budget's steps)"
        )
    if spec.algorithm == "grid":
        for p in spec.parameters.values():
            if not p.discrete:
                raise SpaceError(
                    f'{spec.path}: a grid needs discrete parameters; "{p.name}" is a range, write {{choice: [...]}}'
                )
    if spec.warm_start > spec.total_trials:
        raise SpaceError(
            f"{spec.path}: warm_start {spec.warm_start} is more than the search's {spec.total_trials} trial(s); "
            "lower warm_start or raise num_samples (--num-samples)"
        )


def _parse_scheduler(raw: Any, where: str) -> SchedulerSpec:
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict):
        raise SpaceError(f"{where}: scheduler must be a name ({', '.join(SCHEDULERS)}) or a mapping")
    _check_keys(raw, _SCHEDULER_KEYS, where, "scheduler key")
    name = _one_of(raw.get("name", "fifo"), SCHEDULERS, where, "scheduler")
    return SchedulerSpec(
        name=name,
        grace_period=_positive_int(raw.get("grace_period", 100), where, "scheduler grace_period"),
        reduction_factor=_positive_int(raw.get("reduction_factor", 3), where, "scheduler reduction_factor", minimum=2),
    )


def _check_keys(raw: dict, allowed: Iterable[str], where: str, what: str) -> None:
    for key in raw:
        if key not in allowed:
            raise SpaceError(
                f'{where}: unknown {what} "{key}"{did_you_mean(str(key), allowed)}; allowed: {", ".join(allowed)}'
            )


def _one_of(value: Any, options: tuple[str, ...], where: str, what: str) -> str:
    if value not in options:
        raise SpaceError(
            f'{where}: unknown {what} "{value}"{did_you_mean(str(value), options)}; use one of {", ".join(options)}'
        )
    return str(value)


def _flag(value: Any, where: str, what: str) -> bool:
    if not isinstance(value, bool):
        raise SpaceError(f"{where}: {what} must be true or false, got {value!r}")
    return value


def _positive_int(value: Any, where: str, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpaceError(f"{where}: {what} must be an integer >= {minimum}, got {value!r}")
    return value


def searched_augmentations(spec: SearchSpec) -> list[str]:
    """List the augmentation recipes that a space's ``augment`` parameter may take.

    Args:
        spec: The space.

    Returns:
        The recipes; empty when the space has no ``augment`` parameter.
    """

    augment = spec.parameters.get("augment")
    return [] if augment is None else [v for v in augment.corners() if v is not None]
