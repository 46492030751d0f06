"""An Optuna sampler (the space's, ``space.samplers``) as a Ray Tune search algorithm: Ray Tune's ``OptunaSearch``
over the space's define-by-run function, telling Optuna the truth about each trial's end (``OptunaSearcher``), with a
warm start and one or more objectives.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray.tune.search.optuna import OptunaSearch

from vitplast_tune._compat import ray_tune
from vitplast_tune.components import component_flags
from vitplast_tune.space.distributions import OptunaSpace
from vitplast_tune.space.files import SearchSpec
from vitplast_tune.space.samplers import make_sampler


class OptunaSearcher(OptunaSearch):
    """Ray Tune's OptunaSearch, telling Optuna the truth about each trial's end.

    Every evaluation is an intermediate value at its training step. A trial that reached its budget
    (``max_steps``) is COMPLETE; one the scheduler stopped earlier is PRUNED, so TPE does not take
    its truncated accuracy for a final one; one that errored or diverged is FAIL (the stock searcher
    reports both as COMPLETE with their last value).
    """

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Report the metric to the Optuna trial at the training step (a resumed step is reported once).

        Args:
            trial_id: Tune's trial id.
            result: The trial's report (its metric and ``step``).
        """
        if isinstance(self.metric, list):  # several objectives: Optuna takes no intermediate values
            return
        value, step = result.get(self.metric), result.get("step")
        live = ray_tune.optuna_trials(self)
        if trial_id in ray_tune.completed_trials(self) or trial_id not in live or step is None:
            return
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        with warnings.catch_warnings():  # Optuna warns and ignores a step reported again after a restore
            warnings.simplefilter("ignore")
            live[trial_id].report(float(value), int(step))

    def restore_from_dir(self, checkpoint_dir: str) -> None:
        """Restore TPE from its state in Tune's folder.

        Without that state (moved aside, ``plan.state``) this TPE starts afresh and samples the trials not sampled
        yet (Tune's generator state counts them).

        Args:
            checkpoint_dir: Tune's folder of the searcher's state.
        """
        if not any(Path(checkpoint_dir).glob(self.CKPT_FILE_TMPL.format("*"))):
            return
        super().restore_from_dir(checkpoint_dir)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """End the Optuna trial: FAIL (errored or diverged), PRUNED (stopped before max_steps) or COMPLETE.

        A trial this searcher did not suggest (restored from Tune's state when a new TPE took over,
        ``restore_from_dir``) is not its to end.

        Args:
            trial_id: Tune's trial id.
            result: The trial's last report (None: none).
            error: Whether the trial errored.
        """
        if trial_id not in ray_tune.optuna_trials(self) and trial_id not in ray_tune.completed_trials(self):
            return
        if error or (result or {}).get("diverged"):
            return super().on_trial_complete(trial_id, result=None, error=True)
        live, completed = ray_tune.optuna_trials(self), ray_tune.completed_trials(self)
        if result and result.get("step", 0) < result.get("max_steps", 0) and trial_id in live:
            if trial_id not in completed:
                import optuna

                ray_tune.optuna_study(self).tell(live[trial_id], state=optuna.trial.TrialState.PRUNED)
                completed.add(trial_id)
            return
        super().on_trial_complete(trial_id, result=result, error=error)


def objectives(spec: SearchSpec) -> tuple[str | list[str], str | list[str]]:
    """OptunaSearch's ``metric`` and ``mode``: one each, or lists for a multi-objective space (Optuna's Pareto front).

    Tune's scheduler and result grid still use ``spec.metric`` (the first objective); a multi-objective
    space has no early stopping (``space.files`` refuses ASHA and median stopping for it).
    """
    if not spec.multi_objective:
        return spec.metric, spec.mode
    return [m for m, _ in spec.objectives], [d for _, d in spec.objectives]


def warm_start_points(spec: SearchSpec, subsets: Sequence[str]) -> list[dict[str, Any]]:
    """TPE's first trials (OptunaSearch ``points_to_evaluate``, i.e. Optuna's ``enqueue_trial``): the first
    ``spec.warm_start`` of ``subsets`` as the space's component flags; the other parameters are sampled."""
    return [component_flags(subset) for subset in list(subsets)[: spec.warm_start]]


def optuna_searcher(spec: SearchSpec, seed: int, warm_start: Sequence[str] = ()) -> OptunaSearcher:
    """The space's sampler (``spec.sampler``, seeded) over the space; ``warm_start``: subsets ranked best first, of
    which it tries ``spec.warm_start`` first."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metric, mode = objectives(spec)
    points = warm_start_points(spec, warm_start) or None
    space, sampler = OptunaSpace(spec.parameters), make_sampler(spec.sampler, seed, spec.parameters)
    return OptunaSearcher(space=space, metric=metric, mode=mode, sampler=sampler, points_to_evaluate=points)
