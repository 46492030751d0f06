"""Plan a search's reference trials of full finetuning and the linear probe, at a few rates each."""

from __future__ import annotations

import math
from typing import Any

from vitplast_tune.components import ALL, HEAD
from vitplast_tune.config import FINALIST_KEY, REFERENCE_KEY
from vitplast_tune.errors import SpaceError
from vitplast_tune.space.distributions import Choice, Constant, Distribution, LogUniform, Uniform

BASELINES = (ALL, HEAD)  # full finetuning and the linear probe
DEFAULT_RATES = 3  # rates of each baseline where a space has no ``baselines`` key and searches components with TPE
DEFAULT_TRIALS = 2 * 2 * DEFAULT_RATES  # and runs at least this many trials: twice its reference trials
SEARCH, BASELINE, FINALIST = "search", "baseline", "finalist"  # a trial's stage (``stage_of``)


def applies(algorithm: str, parameters: dict[str, Distribution]) -> bool:
    """Tell whether a space can train reference trials: a TPE search whose components vary."""
    components, lr = parameters.get("components"), parameters.get("lr")
    varies = components is not None and not isinstance(components, Constant)
    return algorithm == "optuna" and varies and (lr is None or isinstance(lr, (Constant, Choice, Uniform)))


def _parse_baselines(
    raw: Any, algorithm: str, parameters: dict[str, Distribution], num_samples: int, where: str
) -> int:
    """Read a space file's ``baselines`` key, ``{rates: R}``, else its default, as the rates per baseline."""
    if raw is None:
        return DEFAULT_RATES if applies(algorithm, parameters) and num_samples >= DEFAULT_TRIALS else 0
    rates = raw.get("rates") if isinstance(raw, dict) and set(raw) == {"rates"} else None
    if isinstance(rates, bool) or not isinstance(rates, int) or rates < 0:
        raise SpaceError(f"{where}: baselines must be {{rates: R}}, R an integer >= 0 (0: none), got {raw!r}")
    if rates and not applies(algorithm, parameters):
        raise SpaceError(
            f"{where}: baselines need algorithm: optuna, a components parameter that varies and an lr of "
            "{loguniform|uniform|choice: ...} or a constant (a grid lists its own: add all and head to its "
            "components); set baselines: {rates: 0}"
        )
    return rates


def sweep(lr: Distribution | None, rates: int) -> list[float | None]:
    """Spread ``rates`` rates over the rate dimension, in log for a log-uniform one; None is the settings' rate."""
    if rates <= 0:
        return []
    if lr is None:
        return [None]
    if isinstance(lr, Constant):
        return [lr.value]
    if isinstance(lr, Choice):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in lr.values):
            return [lr.values[0]]  # not all rates: the settings' check names the bad one
        values = sorted(float(v) for v in lr.values)
        picks = sorted({round((i + 0.5) * len(values) / rates - 0.5) for i in range(rates)})
        return [values[min(max(i, 0), len(values) - 1)] for i in picks]
    if isinstance(lr, Uniform):
        low, high = (math.log(lr.low), math.log(lr.high)) if isinstance(lr, LogUniform) else (lr.low, lr.high)
        points = [low + (i + 0.5) * (high - low) / rates for i in range(rates)]
        return [float(f"{math.exp(p) if isinstance(lr, LogUniform) else p:.3g}") for p in points]
    return [lr.corners()[0]]


def references(parameters: dict[str, Distribution], rates: int) -> list[dict[str, Any]]:
    """Make the configs of a space's reference trials: each rate, full finetuning then the linear probe."""
    base: dict[str, Any] = {}
    for name, p in parameters.items():
        if name not in ("components", "lr", "seed", "blocks"):
            base[name] = "all" if name == "depth" else (p.value if isinstance(p, Constant) else p.corners()[0])
    made = [
        {**base, "components": name, **({"lr": rate} if rate is not None else {})}
        for rate in sweep(parameters.get("lr"), rates)
        for name in BASELINES
    ]
    return [{**config, REFERENCE_KEY: {"index": i + 1, "of": len(made)}} for i, config in enumerate(made)]


def stage_of(config: dict[str, Any]) -> str:
    """Return a trial's stage from its config: ``finalist``, ``baseline`` or ``search``."""
    if isinstance(config.get(FINALIST_KEY), dict):
        return FINALIST
    return BASELINE if isinstance(config.get(REFERENCE_KEY), dict) else SEARCH
