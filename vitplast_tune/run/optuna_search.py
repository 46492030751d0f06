"""Run the space's Optuna sampler as a Ray Tune search algorithm, telling Optuna how each trial ended."""

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
    """Wrap Ray Tune's OptunaSearch to end each Optuna trial as COMPLETE, PRUNED or FAIL, as it truly ended."""

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Report the metric to the Optuna trial at its training step, a resumed step once."""
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
        """Restore TPE from its state in Tune's folder; without it, start afresh."""
        if not any(Path(checkpoint_dir).glob(self.CKPT_FILE_TMPL.format("*"))):
            return
        super().restore_from_dir(checkpoint_dir)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """End the Optuna trial of a trial this searcher suggested: FAIL, PRUNED or COMPLETE."""
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
    """Return OptunaSearch's ``metric`` and ``mode``: one each, or lists for a multi-objective space."""
    if not spec.multi_objective:
        return spec.metric, spec.mode
    return [m for m, _ in spec.objectives], [d for _, d in spec.objectives]


def warm_start_points(spec: SearchSpec, subsets: Sequence[str]) -> list[dict[str, Any]]:
    """Return TPE's first trials: the first ``spec.warm_start`` of ``subsets`` as component flags."""
    return [component_flags(subset) for subset in list(subsets)[: spec.warm_start]]


def _optuna_searcher(spec: SearchSpec, seed: int, warm_start: Sequence[str] = ()) -> OptunaSearcher:
    """Build the space's seeded sampler over the space, trying ``spec.warm_start`` of ``warm_start`` first."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metric, mode = objectives(spec)
    points = warm_start_points(spec, warm_start) or None
    space, sampler = OptunaSpace(spec.parameters), make_sampler(spec.sampler, seed, spec.parameters)
    return OptunaSearcher(space=space, metric=metric, mode=mode, sampler=sampler, points_to_evaluate=points)
