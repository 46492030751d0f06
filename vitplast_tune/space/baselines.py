"""The baselines of a search: full finetuning (``all`` in every block) and the linear probe (``head``), each trained as
a reference trial of the search at a few rates of its rate dimension, so that every answer is compared with both.

Here, without Ray: the space key ``baselines: {rates: R}`` (``parse_baselines``; 0 turns them off), the rates
(``sweep``), the reference trials' configs (``references``) and a trial's stage (``stage_of``). The reference trials
come first, each marked in its config (``REFERENCE_KEY``); Ray Tune's scheduler never stops one early
(``run.finalists``) and TPE does not learn from them (its study holds the trials it drew).

Where the space has no key, a TPE search over components (``algorithm: optuna`` and a ``components`` that is not a
constant) of at least ``DEFAULT_TRIALS`` trials (twice the reference trials ``DEFAULT_RATES`` makes) trains
``DEFAULT_RATES`` rates of each; any other search none, a smoke test of a few trials included (a plan turns off the
reference trials of a search with fewer than twice as many trials of its own, with a note: ``plan.finalists``).
"""

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
    """Whether a space can train reference trials: a TPE search (``algorithm: optuna``) whose components vary, and
    whose rate, if it has one, is a constant, a choice or a range of floats (``sweep``)."""
    components, lr = parameters.get("components"), parameters.get("lr")
    varies = components is not None and not isinstance(components, Constant)
    return algorithm == "optuna" and varies and (lr is None or isinstance(lr, (Constant, Choice, Uniform)))


def parse_baselines(raw: Any, algorithm: str, parameters: dict[str, Distribution], num_samples: int, where: str) -> int:
    """Read a space file's ``baselines`` key: how many rates each baseline trains at.

    Args:
        raw: The key's value: ``{rates: R}`` (None: absent).
        algorithm: The space's algorithm.
        parameters: Its parameters.
        num_samples: Its trials.
        where: The file, for messages.

    Returns:
        The rates per baseline: the key's, else ``DEFAULT_RATES`` where the space applies (``applies``) and runs at
        least ``DEFAULT_TRIALS`` trials, else 0.

    Raises:
        SpaceError: Not ``{rates: R}`` with R an integer >= 0, or R > 0 in a space that does not apply (``applies``).
    """
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
    """The rates a baseline trains at: ``rates`` points spread evenly over the rate dimension (in log for a
    log-uniform one, each in the middle of its share), its listed values (evenly picked), or its one value.

    Args:
        lr: The space's ``lr`` parameter (None: the settings' rate).
        rates: How many.

    Returns:
        The rates, ascending (None: the settings' rate); none when ``rates`` is 0. A rate of another kind (an
        integer range) gets its lower end.
    """
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
    """The configs of a space's reference trials, in the order they are suggested: each rate of the sweep, full
    finetuning then the linear probe.

    Each holds the space's constants, the first value of any other parameter it searches (``depth``: all), its
    subset, its rate and ``REFERENCE_KEY``: its number (from 1) and the reference trials in all (``of``).

    Args:
        parameters: The space's parameters.
        rates: The rates per baseline (a ``SearchSpec``'s ``baselines``; 0: none).

    Returns:
        The configs; none without baselines.
    """
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
    """A trial's stage from its config: ``finalist`` (trained again after the search), ``baseline`` (a reference
    trial) or ``search`` (one its sampler drew)."""
    if isinstance(config.get(FINALIST_KEY), dict):
        return FINALIST
    return BASELINE if isinstance(config.get(REFERENCE_KEY), dict) else SEARCH
