"""Keep the search's Optuna study up to date while it runs, one trial added as it ends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.tune import Callback

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.records.study import frozen_trials, known_trials, open_study, storage_url
from vitplast_tune.records.table import trial_table
from vitplast_tune.records.tracking import is_number
from vitplast_tune.space.baselines import SEARCH, stage_of
from vitplast_tune.space.files import SearchSpec


class LiveStudy(Callback):
    """Make the search's study before its first trial and add each trial of its sampler as it ends."""

    def __init__(
        self,
        directory: Path,
        name: str,
        spec: SearchSpec,
        settings: FinetuneConfig,
        run_of: Callable[[str], str | None] | None = None,
    ):
        self.directory, self.name, self.spec, self.settings, self.run_of = Path(directory), name, spec, settings, run_of
        self.metrics = [m for m, _ in spec.objectives] or [spec.metric]
        self.curves: dict[str, dict[str, dict[int, float]]] = {}
        self._study = None
        self._known: set[str] = set()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_study": None, "_known": set()}

    @property
    def url(self) -> str:
        return storage_url(self.directory)

    @property
    def study(self):
        if self._study is None:
            self._study = open_study(self.directory, self.name, self.spec)
            self._known = known_trials(self._study)
        return self._study

    def setup(self, **info) -> None:
        self.study  # noqa: B018 - made now: the dashboard opens it before any trial ends

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        step = result.get("step")
        if step is None:
            return
        curve = self.curves.setdefault(trial.trial_id, {})
        for metric in self.metrics:
            if is_number(value := result.get(metric)):
                curve.setdefault(metric, {})[int(step)] = float(value)

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        self._add(trial, None)

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        self._add(trial, "error")

    def _add(self, trial, error: str | None) -> None:
        curves = {trial.trial_id: self.curves.pop(trial.trial_id, {})}
        study = self.study
        if trial.trial_id in self._known or stage_of(trial.config or {}) != SEARCH:
            return  # a resumed search's trial that ended before, a reference trial or a finalist: not the sampler's
        run_id = self.run_of(trial.trial_id) if self.run_of is not None else None
        row = trial_table([_Ended(trial, error)], self.settings).assign(run_id=run_id)
        study.add_trial(frozen_trials(row, self.spec, curves)[0])
        self._known.add(trial.trial_id)

    def get_state(self) -> dict:
        return {"curves": self.curves}

    def set_state(self, state: dict) -> None:
        self.curves.update(state.get("curves", {}))


@dataclass
class _Ended:
    """Hold a Tune trial as the trial table reads a result."""

    trial: Any
    error: str | None
    metrics_dataframe: None = None

    @property
    def config(self) -> dict:
        return self.trial.config

    @property
    def metrics(self) -> dict:
        return {**(self.trial.last_result or {}), "trial_id": self.trial.trial_id}
