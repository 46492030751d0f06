"""Ray Tune internals (read from Ray 2.60.0): ``OptunaSearch``'s live Optuna study and trials, and a restored
``Tuner``'s run config (Ray restores the pickled callbacks and failure budget, with no public way to renew them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def optuna_study(searcher) -> Any:
    """The Optuna study an ``OptunaSearch`` asks and tells (``_ot_study``)."""
    return searcher._ot_study


def optuna_trials(searcher) -> dict[str, Any]:
    """The live Optuna trial of each Tune trial id an ``OptunaSearch`` suggested and has not ended (``_ot_trials``)."""
    return searcher._ot_trials


def completed_trials(searcher) -> set[str]:
    """The Tune trial ids an ``OptunaSearch`` has already told Optuna about (``_completed_trials``)."""
    return searcher._completed_trials


def renew_run_config(restored, renew: Callable[[Any], Any]) -> None:
    """Apply ``renew(run_config) -> run_config`` to a restored Tuner's run config: in this process (``_local_tuner``),
    or in the Tuner actor of a Ray Client (ray://) driver (``_remote_tuner``)."""
    if getattr(restored, "_local_tuner", None) is not None:
        renew(restored._local_tuner.get_run_config())
        return
    import ray

    remote = restored._remote_tuner
    ray.get(remote.set_run_config_and_remote_string_queue.remote(renew(ray.get(remote.get_run_config.remote())), None))
