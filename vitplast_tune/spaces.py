"""Search-space files: reading and validating them, and turning them into Optuna or Ray Tune spaces.

A space file is YAML (see ``search_spaces/component_subsets.yaml``)::

    description: Any non-empty subset of the six components, and the learning rate.
    metric: val_acc            # what to optimise, reported by every trial
    mode: max                  # max | min
    algorithm: optuna          # optuna (TPE) | grid | random
    num_samples: 20            # trials (grid: repeats of the whole grid)
    scheduler: {name: asha, grace_period: 100, reduction_factor: 3}   # asha | median | fifo
    parameters:                # what each trial gets; a plain value is a constant
      components: {subsets: any}          # or {choice: [[mha], [fc1], all, head]} or "mha+fc1"
      lr: {loguniform: [1.0e-3, 1.0]}     # also {uniform: [a, b]}, {randint: [a, b]}, {choice: [...]}
      optimizer: sgd
    defaults: {max_steps: 400, batch_size: 64}   # experiment settings; command-line flags override

A subset is encoded for Optuna as one boolean per component (``train_emb`` ... ``train_fc2``).
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from vitplast_tune.components import COMPONENTS, parse_subset, subset_name
from vitplast_tune.errors import UserError, did_you_mean

SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
ALGORITHMS = ("optuna", "grid", "random")
SCHEDULERS = ("asha", "median", "fifo")
MODES = ("max", "min")
_TOP_KEYS = ("description", "metric", "mode", "algorithm", "num_samples", "scheduler", "parameters", "defaults")
_SCHEDULER_KEYS = ("name", "grace_period", "reduction_factor")
_DISTRIBUTIONS = ("choice", "uniform", "loguniform", "randint", "subsets")


def component_flag(component: str) -> str:
    """Config key of the boolean that says whether a component trains: ``train_<name>``."""
    return f"train_{component}"


COMPONENT_FLAGS = tuple(component_flag(c) for c in COMPONENTS)


# ----------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class Param:
    """One parameter of a space: a constant, a choice, a (log-)uniform or integer range, or subsets."""

    name: str
    kind: str  # constant | choice | uniform | loguniform | randint | subsets
    values: tuple = ()
    low: float = 0.0
    high: float = 0.0

    @property
    def is_discrete(self) -> bool:
        return self.kind in ("constant", "choice", "subsets")

    def grid_values(self) -> list:
        """Every value of a discrete parameter, for a grid."""
        if self.kind in ("constant", "choice"):
            return list(self.values)
        if self.kind == "subsets":
            return all_subsets(allow_head="head" in self.values)
        raise UserError(f'parameter "{self.name}" is a {self.kind} range; a grid needs {{choice: [...]}}')


def all_subsets(allow_head: bool = False) -> list[str]:
    """Names of all non-empty subsets of the six components (and "head" when allowed)."""
    subsets = [
        subset_name(combo)
        for k in range(1, len(COMPONENTS) + 1)
        for combo in itertools.combinations(COMPONENTS, k)
    ]
    return (["head"] if allow_head else []) + subsets


def _subset(value: Any, where: str) -> str:
    """A component subset named in a space file; an empty list is a mistake ("head" is explicit)."""
    if not isinstance(value, (str, list)) or (isinstance(value, list) and not value) or value == "":
        raise UserError(f'{where}: empty or malformed component subset {value!r}; name components such as '
                        '[mha, fc1], or "head" to train only the classification head (linear probe)')
    return subset_name(parse_subset(value))


def _parse_param(name: str, raw: Any, where: str) -> Param:
    if not isinstance(raw, dict):
        if name == "components":
            return Param(name, "constant", (_subset(raw, where),))
        if isinstance(raw, (list, tuple)):
            raise UserError(f'{where}: parameter "{name}" is a list; write {{choice: [...]}} to search over it')
        return Param(name, "constant", (raw,))
    if len(raw) != 1:
        raise UserError(f'{where}: parameter "{name}" needs exactly one of {", ".join(_DISTRIBUTIONS)}, got {sorted(raw)}')
    kind, arg = next(iter(raw.items()))
    if kind not in _DISTRIBUTIONS:
        raise UserError(f'{where}: parameter "{name}" has unknown distribution "{kind}"{did_you_mean(kind, _DISTRIBUTIONS)}')
    if kind == "subsets":
        if name != "components":
            raise UserError(f'{where}: {{subsets: ...}} only applies to "components", not "{name}"')
        if arg not in ("any", "any_or_head"):
            raise UserError(f'{where}: components {{subsets: {arg}}} must be "any" (non-empty) or "any_or_head"')
        return Param(name, "subsets", ("head",) if arg == "any_or_head" else ())
    if kind == "choice":
        if not isinstance(arg, list) or not arg:
            raise UserError(f'{where}: parameter "{name}" {{choice: ...}} needs a non-empty list')
        if name == "components":
            return Param(name, "choice", tuple(dict.fromkeys(_subset(v, where) for v in arg)))
        return Param(name, "choice", tuple(arg))
    if not (isinstance(arg, list) and len(arg) == 2 and all(isinstance(v, (int, float)) for v in arg)):
        raise UserError(f'{where}: parameter "{name}" {{{kind}: ...}} needs [low, high] numbers, got {arg!r}')
    low, high = float(arg[0]), float(arg[1])
    if not low < high:
        raise UserError(f'{where}: parameter "{name}" range [{arg[0]}, {arg[1]}] is empty or inverted; write [low, high] with low < high')
    if kind == "loguniform" and low <= 0:
        raise UserError(f'{where}: parameter "{name}" loguniform range must be positive, got [{arg[0]}, {arg[1]}]')
    if kind == "randint" and not (low.is_integer() and high.is_integer()):
        raise UserError(f'{where}: parameter "{name}" randint bounds must be integers')
    return Param(name, kind, (), low, high)


# ----------------------------------------------------------------------------- spec


@dataclass(frozen=True)
class SchedulerSpec:
    """Early stopping: ``asha`` (grace period and reduction factor in steps), ``median`` or ``fifo`` (none)."""

    name: str = "fifo"
    grace_period: int = 100
    reduction_factor: int = 3


@dataclass(frozen=True)
class SearchSpec:
    """A validated space file."""

    name: str
    path: Path
    description: str
    metric: str
    mode: str
    algorithm: str
    num_samples: int
    scheduler: SchedulerSpec
    parameters: dict[str, Param]
    defaults: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    @property
    def fingerprint(self) -> str:
        """Hash of the file's content: a resumed search must use the same space."""
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]

    @property
    def grid(self) -> list[dict[str, Any]]:
        """Every configuration of a grid space (one repeat), in file order."""
        names = list(self.parameters)
        axes = [self.parameters[n].grid_values() for n in names]
        return [dict(zip(names, combo)) for combo in itertools.product(*axes)]

    @property
    def total_trials(self) -> int:
        """Trials this space runs: num_samples, or grid size times num_samples for a grid."""
        return len(self.grid) * self.num_samples if self.algorithm == "grid" else self.num_samples

    def example(self) -> dict[str, Any]:
        """One representative configuration (lowest of each range), for validating settings."""
        example = {}
        for name, p in self.parameters.items():
            example[name] = p.values[0] if p.kind in ("constant", "choice") else "all" if p.kind == "subsets" else p.low
            if p.kind == "randint":
                example[name] = int(p.low)
        return example

    def with_overrides(self, num_samples: int | None = None) -> "SearchSpec":
        """A copy with the command line's ``--num-samples`` applied (and validated)."""
        if num_samples is None:
            return self
        if num_samples < 1:
            raise UserError(f"--num-samples must be at least 1, got {num_samples}")
        return SearchSpec(**{**self.__dict__, "num_samples": num_samples})


def resolve_space_path(name_or_path: str | Path) -> Path:
    """A space file by name in ``search_spaces/`` (with or without .yaml) or by path."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    for candidate in (SPACES_DIR / f"{name_or_path}.yaml", SPACES_DIR / f"{name_or_path}.yml", SPACES_DIR / str(name_or_path)):
        if candidate.is_file():
            return candidate
    known = list_spaces()
    raise UserError(f'search space "{name_or_path}" not found{did_you_mean(str(name_or_path), known)}; known: {", ".join(known)}, or a path to a .yaml file')


def list_spaces() -> list[str]:
    """Names of the space files shipped in ``search_spaces/``."""
    return sorted(p.stem for p in SPACES_DIR.glob("*.yaml"))


def load_space(name_or_path: str | Path) -> SearchSpec:
    """Read and validate a space file; raise UserError naming the file and the problem."""
    path = resolve_space_path(name_or_path)
    text = path.read_text()
    where = str(path)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{where}: malformed YAML{at}: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(raw, dict):
        raise UserError(f"{where}: a space file is a YAML mapping with keys {', '.join(_TOP_KEYS)}")
    _check_keys(raw, _TOP_KEYS, where, "key")
    parameters = raw.get("parameters") or {}
    if not isinstance(parameters, dict) or not parameters:
        raise UserError(f"{where}: needs a non-empty 'parameters' mapping")
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise UserError(f"{where}: 'defaults' must be a mapping of settings")
    spec = SearchSpec(
        name=path.stem,
        path=path,
        description=str(raw.get("description", "")).strip(),
        metric=str(raw.get("metric", "val_acc")),
        mode=_one_of(raw.get("mode", "max"), MODES, where, "mode"),
        algorithm=_one_of(raw.get("algorithm", "optuna"), ALGORITHMS, where, "algorithm"),
        num_samples=_positive_int(raw.get("num_samples", 1), where, "num_samples"),
        scheduler=_parse_scheduler(raw.get("scheduler", "fifo"), where),
        parameters={str(k): _parse_param(str(k), v, where) for k, v in parameters.items()},
        defaults=dict(defaults),
        text=text,
    )
    _check_algorithm(spec)
    return spec


def _check_algorithm(spec: SearchSpec) -> None:
    if spec.algorithm not in ALGORITHMS:
        raise UserError(f'unknown algorithm "{spec.algorithm}"{did_you_mean(spec.algorithm, ALGORITHMS)}; use one of {", ".join(ALGORITHMS)}')
    if spec.algorithm == "grid":
        for p in spec.parameters.values():
            if not p.is_discrete:
                raise UserError(f'{spec.path}: a grid needs discrete parameters; "{p.name}" is a {p.kind} range, write {{choice: [...]}}')


def _parse_scheduler(raw: Any, where: str) -> SchedulerSpec:
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict):
        raise UserError(f"{where}: scheduler must be a name ({', '.join(SCHEDULERS)}) or a mapping")
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
            raise UserError(f'{where}: unknown {what} "{key}"{did_you_mean(str(key), allowed)}; allowed: {", ".join(allowed)}')


def _one_of(value: Any, options: tuple[str, ...], where: str, what: str) -> str:
    if value not in options:
        raise UserError(f'{where}: unknown {what} "{value}"{did_you_mean(str(value), options)}; use one of {", ".join(options)}')
    return str(value)


def _positive_int(value: Any, where: str, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{where}: {what} must be an integer >= {minimum}, got {value!r}")
    return value


# ----------------------------------------------------------------------------- samplers


class OptunaSpace:
    """Define-by-run function for Ray Tune's OptunaSearch (picklable, so the searcher can be saved).

    A subset is one boolean per component. For a non-empty subset, the last flag is only asked
    when an earlier one is set; otherwise fc2 is forced on (and recorded as a constant).
    """

    def __init__(self, spec: SearchSpec):
        self.parameters = spec.parameters

    def __call__(self, trial) -> dict[str, Any]:
        constants: dict[str, Any] = {}
        for name, p in self.parameters.items():
            if p.kind == "constant":
                constants[name] = p.values[0]
            elif p.kind == "choice":
                trial.suggest_categorical(name, list(p.values))
            elif p.kind in ("uniform", "loguniform"):
                trial.suggest_float(name, p.low, p.high, log=p.kind == "loguniform")
            elif p.kind == "randint":
                trial.suggest_int(name, int(p.low), int(p.high))
            else:
                flags = {}
                for component in COMPONENTS[:-1]:
                    flags[component] = trial.suggest_categorical(component_flag(component), [True, False])
                last = COMPONENTS[-1]
                if any(flags.values()) or "head" in p.values:
                    flags[last] = trial.suggest_categorical(component_flag(last), [True, False])
                else:
                    flags[last] = constants[component_flag(last)] = True
                constants[name] = subset_name(c for c, on in flags.items() if on)
        return constants


def tune_param_space(spec: SearchSpec) -> dict[str, Any]:
    """The Ray Tune param_space of a grid or random space (not used for optuna)."""
    from ray import tune

    space: dict[str, Any] = {}
    for name, p in spec.parameters.items():
        if p.kind == "constant":
            space[name] = p.values[0]
        elif spec.algorithm == "grid":
            space[name] = tune.grid_search(p.grid_values())
        elif p.kind in ("choice", "subsets"):
            space[name] = tune.choice(p.grid_values())
        elif p.kind == "uniform":
            space[name] = tune.uniform(p.low, p.high)
        elif p.kind == "loguniform":
            space[name] = tune.loguniform(p.low, p.high)
        else:
            space[name] = tune.randint(int(p.low), int(p.high) + 1)
    return space


def config_components(config: dict[str, Any]) -> str:
    """The subset a trial config trains, as a readable name ("all" when the space names none)."""
    return subset_name(parse_subset(config.get("components", "all")))


def component_flags(subset: str) -> dict[str, bool]:
    """One boolean per component (``train_<name>``) for a subset name."""
    chosen = parse_subset(subset)
    return {component_flag(c): c in chosen for c in COMPONENTS}
