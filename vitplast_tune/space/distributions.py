"""Define the typed parameter distributions of a space file, in the manner of Optuna's."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from vitplast_tune.components import (
    ALL,
    COMPONENTS,
    FROZEN,
    all_subsets,
    check_depth,
    component_flag,
    contiguous_depths,
    method_flag,
    parse_methods,
    parse_subset,
    subset_name,
)
from vitplast_tune.errors import SpaceError, UserError, did_you_mean

if TYPE_CHECKING:
    from optuna.trial import Trial

N = TypeVar("N", int, float)


@dataclass(frozen=True)
class Distribution:
    """Hold one parameter of a space, with its Optuna suggestion, grid values and corners.

    Attributes:
        name: The parameter's name in the space file and in a trial's config.
    """

    name: str
    discrete: ClassVar[bool] = True

    def suggest(self, trial: Trial) -> dict[str, Any]:
        """Ask an Optuna trial for this parameter.

        Args:
            trial: The Optuna trial, asked define-by-run.

        Returns:
            The constants this parameter adds to the trial's config (often none).
        """
        raise NotImplementedError

    def grid_values(self) -> list[Any]:
        """List every value, for a grid search; a range refuses.

        Returns:
            The values.
        """
        raise SpaceError(f'parameter "{self.name}" is a range; a grid needs {{choice: [...]}}')

    def corners(self) -> list[Any]:
        """List values that touch every choice and both ends of a range, to validate settings before a search.

        Returns:
            The values.
        """
        return self.grid_values()

    def describe(self) -> str:
        """Put the distribution in words, as a dry run prints it.

        Returns:
            The words, e.g. ``log-uniform [0.001, 1]``.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class Constant(Distribution):
    """Hold a plain value, the same in every trial.

    Attributes:
        value: The value.
    """

    value: Any = None

    def suggest(self, trial: Trial) -> dict[str, Any]:
        return {self.name: self.value}

    def describe(self) -> str:
        return f"{self.value} (fixed)"

    def grid_values(self) -> list[Any]:
        return [self.value]


@dataclass(frozen=True)
class Choice(Distribution):
    """Draw one of the listed values, written ``{choice: [a, b, ...]}``.

    Attributes:
        values: The values.
    """

    values: tuple = ()

    def suggest(self, trial: Trial) -> dict[str, Any]:
        trial.suggest_categorical(self.name, list(self.values))
        return {}

    def describe(self) -> str:
        return f"one of {', '.join(map(str, self.values))}"

    def grid_values(self) -> list[Any]:
        return list(self.values)


@dataclass(frozen=True)
class _Range(Distribution, Generic[N]):
    """Draw a number between ``low`` and ``high``, both included."""

    low: N
    high: N
    discrete: ClassVar[bool] = False
    integer: ClassVar[bool] = False  # an integer (``Trial.suggest_int``), else a float
    log: ClassVar[bool] = False  # drawn uniformly in log space
    words: ClassVar[str] = ""  # the words of ``describe``, with ``{low}`` and ``{high}``

    def suggest(self, trial: Trial) -> dict[str, Any]:
        if self.integer:
            trial.suggest_int(self.name, int(self.low), int(self.high))
        else:
            trial.suggest_float(self.name, self.low, self.high, log=self.log)
        return {}

    def describe(self) -> str:
        return self.words.format(low=self.low, high=self.high)

    def corners(self) -> list[Any]:
        return [self.low, self.high]


@dataclass(frozen=True)
class Uniform(_Range[float]):
    """Draw a float uniformly, written ``{uniform: [low, high]}``."""

    words: ClassVar[str] = "uniform [{low:g}, {high:g}]"


@dataclass(frozen=True)
class LogUniform(Uniform):
    """Draw a positive float uniformly in log space, written ``{loguniform: [low, high]}``."""

    log: ClassVar[bool] = True
    words: ClassVar[str] = "log-uniform [{low:g}, {high:g}]"


@dataclass(frozen=True)
class RandInt(_Range[int]):
    """Draw an integer in [low, high], written ``{randint: [low, high]}``."""

    integer: ClassVar[bool] = True
    words: ClassVar[str] = "an integer in [{low}, {high}]"


@dataclass(frozen=True)
class Subsets(Distribution):
    """Draw any subset of the components: ``{subsets: any}``, or ``{subsets: any_or_head}`` to allow none.

    Attributes:
        allow_head: Whether the linear probe, with no component, is a value too.
    """

    allow_head: bool = False

    def suggest(self, trial: Trial) -> dict[str, Any]:
        flags = {c: trial.suggest_categorical(component_flag(c), [True, False]) for c in COMPONENTS[:-1]}
        last, constants = COMPONENTS[-1], {}
        if any(flags.values()) or self.allow_head:
            flags[last] = trial.suggest_categorical(component_flag(last), [True, False])
        else:
            flags[last] = constants[component_flag(last)] = True
        return {**constants, self.name: subset_name(c for c, on in flags.items() if on)}

    def grid_values(self) -> list[Any]:
        return all_subsets(allow_head=self.allow_head)

    def corners(self) -> list[Any]:
        return [ALL]

    def describe(self) -> str:
        what = "any subset or the linear probe" if self.allow_head else "any non-empty subset"
        return f"{what} of {', '.join(COMPONENTS)} ({len(self.grid_values())})"


@dataclass(frozen=True)
class Methods(Distribution):
    """Draw a method per component, written ``{methods: {mha: [lora, full], fc1: full}}``; others stay frozen.

    Attributes:
        choices: Each listed component with its methods, in canonical order.
    """

    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def suggest(self, trial: Trial) -> dict[str, Any]:
        picked: dict[str, str] = {}
        constants: dict[str, Any] = {}
        searched = [c for c, options in self.choices if len(options) > 1]
        constant_trains = any(options != (FROZEN,) for _, options in self.choices if len(options) == 1)
        for component, options in self.choices:
            trained = [m for m in options if m != FROZEN]
            if len(options) == 1:
                picked[component] = options[0]
            elif component == searched[-1] and not constant_trains and trained and set(picked.values()) <= {FROZEN}:
                picked[component] = constants[method_flag(component)] = trained[0]
            else:
                picked[component] = trial.suggest_categorical(method_flag(component), list(options))
        return {**constants, self.name: subset_name(picked)}

    def grid_values(self) -> list[Any]:
        names = [c for c, _ in self.choices]
        combos = [dict(zip(names, methods)) for methods in itertools.product(*(o for _, o in self.choices))]
        values = list(dict.fromkeys(subset_name(m) for m in combos))
        return [v for v in values if parse_subset(v)] or values  # the linear probe only when nothing else is listed


_DISTRIBUTIONS: dict[str, type[Distribution]] = {
    "choice": Choice,
    "uniform": Uniform,
    "loguniform": LogUniform,
    "randint": RandInt,
    "subsets": Subsets,
    "methods": Methods,
    "contiguous": Choice,
}


def _subset(value: Any, where: str) -> str:
    """Read a component subset named in a space file; an empty list is a mistake."""
    if not isinstance(value, (str, list)) or (isinstance(value, list) and not value) or value == "":
        raise SpaceError(
            f"{where}: empty or malformed component subset {value!r}; name components such as "
            '[mha, fc1], or "head" to train only the classification head (linear probe)'
        )
    return subset_name(value)


def parse_param(name: str, raw: Any, where: str) -> Distribution:
    """Read one parameter of a space file as a distribution.

    Args:
        name: The parameter's name.
        raw: Its value in the file: a plain value, or a mapping of one distribution kind to its argument.
        where: The file it came from, for messages.

    Returns:
        The distribution.
    """
    if not isinstance(raw, dict):
        if name == "components":
            return Constant(name, _subset(raw, where))
        if name == "depth":
            return Constant(name, str(_where(check_depth, raw, where)))
        if isinstance(raw, (list, tuple)):
            raise SpaceError(f'{where}: parameter "{name}" is a list; write {{choice: [...]}} to search over it')
        return Constant(name, raw)
    if len(raw) != 1:
        raise SpaceError(
            f'{where}: parameter "{name}" needs exactly one of {", ".join(_DISTRIBUTIONS)}, got {sorted(raw)}'
        )
    kind, arg = next(iter(raw.items()))
    if kind not in _DISTRIBUTIONS:
        raise SpaceError(
            f'{where}: parameter "{name}" has unknown distribution "{kind}"{did_you_mean(kind, _DISTRIBUTIONS)}'
        )
    if kind == "subsets":
        if name != "components":
            raise SpaceError(f'{where}: {{subsets: ...}} only applies to "components", not "{name}"')
        if arg not in ("any", "any_or_head"):
            raise SpaceError(f'{where}: components {{subsets: {arg}}} must be "any" (non-empty) or "any_or_head"')
        return Subsets(name, allow_head=arg == "any_or_head")
    if kind in ("methods", "contiguous"):
        return _components_or_depth(name, kind, arg, where)
    if kind == "choice":
        if not isinstance(arg, list) or not arg:
            raise SpaceError(f'{where}: parameter "{name}" {{choice: ...}} needs a non-empty list')
        if name == "components":
            return Choice(name, tuple(dict.fromkeys(_subset(v, where) for v in arg)))
        if name == "depth":
            return Choice(name, tuple(_where(check_depth, str(v), where) for v in arg))
        return Choice(name, tuple(arg))
    return _range(name, kind, arg, where)


def _range(name: str, kind: str, arg: Any, where: str) -> Distribution:
    """Read ``{uniform | loguniform | randint: [low, high]}``."""
    if not (isinstance(arg, list) and len(arg) == 2 and all(isinstance(v, (int, float)) for v in arg)):
        raise SpaceError(f'{where}: parameter "{name}" {{{kind}: ...}} needs [low, high] numbers, got {arg!r}')
    low, high = float(arg[0]), float(arg[1])
    if not low < high:
        raise SpaceError(
            f'{where}: parameter "{name}" range [{arg[0]}, {arg[1]}] is empty or inverted; write [low, high] with low < high'
        )
    if kind == "loguniform" and low <= 0:
        raise SpaceError(f'{where}: parameter "{name}" loguniform range must be positive, got [{arg[0]}, {arg[1]}]')
    if kind == "randint":
        if not (low.is_integer() and high.is_integer()):
            raise SpaceError(f'{where}: parameter "{name}" randint bounds must be integers')
        return RandInt(name, int(low), int(high))
    return _DISTRIBUTIONS[kind](name, low, high)


def _components_or_depth(name: str, kind: str, arg: Any, where: str) -> Distribution:
    """Read ``components: {methods: ...}`` or ``depth: {contiguous: N}``."""
    if kind == "contiguous":
        if name != "depth":
            raise SpaceError(f'{where}: {{contiguous: N}} only applies to "depth", not "{name}"')
        if isinstance(arg, bool) or not isinstance(arg, int) or arg < 1:
            raise SpaceError(f"{where}: depth {{contiguous: N}} needs the model's number of blocks N, got {arg!r}")
        return Choice(name, tuple(contiguous_depths(arg)))
    if name != "components":
        raise SpaceError(f'{where}: {{methods: ...}} only applies to "components", not "{name}"')
    if not isinstance(arg, dict) or not arg:
        raise SpaceError(
            f"{where}: components {{methods: ...}} needs a mapping of component to method(s), "
            "e.g. {mha: [lora, full], fc1: full}"
        )
    choices = []
    for component, raw in arg.items():
        if str(component).lower() not in COMPONENTS:
            _where(parse_subset, str(component), where)  # the unknown-component message
            raise SpaceError(f'{where}: components {{methods: ...}} names each component, not "{component}"')
        options = tuple(dict.fromkeys(str(m) for m in (raw if isinstance(raw, list) else [raw])))
        if not options:
            raise SpaceError(f"{where}: components {{methods: ...}}: {component} lists no method")
        for method in options:
            _where(parse_methods, {component: method}, where)
        choices.append((str(component).lower(), options))
    order = {c: i for i, c in enumerate(COMPONENTS)}
    return Methods(name, tuple(sorted(choices, key=lambda item: order[item[0]])))


def _where(check, value: Any, where: str) -> Any:
    """Return ``check(value)``, its UserError prefixed by the file it came from."""
    try:
        check(value)
    except UserError as exc:
        raise SpaceError(f"{where}: {exc}") from None
    return value


class OptunaSpace:
    """Ask an Optuna trial for every parameter, define-by-run, as Ray Tune's OptunaSearch takes it.

    Args:
        parameters: The space's distributions, by name.
    """

    def __init__(self, parameters: dict[str, Distribution]) -> None:

        self.parameters = parameters

    def __call__(self, trial: Trial) -> dict[str, Any]:
        constants: dict[str, Any] = {}
        for p in self.parameters.values():
            constants.update(p.suggest(trial))
        return constants
