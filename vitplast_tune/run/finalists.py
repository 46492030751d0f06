"""Run a search's stages on Ray Tune: reference trials, the sampler's trials, then the finalists."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ray.tune.schedulers import AsyncHyperBandScheduler, MedianStoppingRule, TrialScheduler
from ray.tune.search import Searcher

from vitplast_tune.space.baselines import SEARCH, stage_of
from vitplast_tune.space.finalists import Ended, Finalists, choose, ended, expected_trials, finalist_of

if TYPE_CHECKING:
    from ray.tune.experiment import Trial


class StagedSearcher(Searcher):
    """Suggest the reference trials, then the search's own trials, then the finalists once those have ended.

    ``main`` is how many trials ``searcher`` suggests; ``seeds`` are the seeds the finalists train on.
    """

    def __init__(
        self,
        searcher: Searcher,
        main: int,
        stage: Finalists,
        seeds: Sequence[int],
        references: Sequence[dict[str, Any]] = (),
    ):
        self.searcher = searcher  # Tune saves a wrapper's own state and its base searcher's apart (get_state)
        self.main, self.stage, self.seeds = main, stage, list(seeds)
        self.references = [copy.deepcopy(c) for c in references]
        self.configs: dict[str, dict[str, Any]] = {}  # the search's trials suggested, by trial id, in order
        self.ended: dict[str, Ended] = {}  # those that ended
        self.planned: list[dict[str, Any]] | None = None  # the finalists' configs, once chosen
        self.given = 0  # how many of them were suggested
        super().__init__(metric=searcher.metric, mode=searcher.mode)

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        """Pass Tune's metric, mode and config to the search's searcher."""
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> dict | None:
        """Return the next trial's config, None to wait, or ``Searcher.FINISHED``."""
        if len(self.configs) < len(self.references):
            self.configs[trial_id] = copy.deepcopy(self.references[len(self.configs)])
            return copy.deepcopy(self.configs[trial_id])
        if len(self.configs) < len(self.references) + self.main:
            config = self.searcher.suggest(trial_id)
            if config == Searcher.FINISHED:  # a searcher that ran out: its trials are the search's
                self.main = len(self.configs) - len(self.references)
            elif isinstance(config, dict):
                self.configs[trial_id] = copy.deepcopy(config)
            if config != Searcher.FINISHED:
                return config
        if len(self.ended) < len(self.configs):
            return None
        if self.planned is None:
            self.planned = choose([self.ended[t] for t in self.configs], self.stage, self.seeds)
        if self.given >= len(self.planned):
            return Searcher.FINISHED
        self.given += 1
        return copy.deepcopy(self.planned[self.given - 1])

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Pass a report on to the searcher when the trial is one it suggested."""
        if self._sampled(trial_id):
            self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Note a trial's end for the finalists' choice, and pass it on when the searcher suggested it."""
        if trial_id not in self.configs:
            return
        if self.planned is None:
            self.ended[trial_id] = ended(self.configs[trial_id], result, error)
        if self._sampled(trial_id):
            self.searcher.on_trial_complete(trial_id, result=result, error=error)

    def _sampled(self, trial_id: str) -> bool:
        """Tell whether the search's searcher suggested a trial."""
        return trial_id in self.configs and stage_of(self.configs[trial_id]) == SEARCH

    def get_state(self) -> dict:
        """Return this wrapper's state, without its searcher's, which Tune saves apart."""
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k != "searcher"})

    def set_state(self, state: dict) -> None:
        """Restore this wrapper's state."""
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        """Save the search's searcher."""
        self.searcher.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        """Restore the search's searcher."""
        self.searcher.restore(checkpoint_path)


def _is_spared(trial: Trial) -> bool:
    """Tell whether a Tune trial is a reference trial or a finalist, which no scheduler stops early."""
    return stage_of(getattr(trial, "config", None) or {}) != SEARCH  # a replay's trials may have no config


class _Sparing(TrialScheduler):
    """Keep a scheduler's early stopping off the reference trials and the finalists, and out of its rungs."""

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        if not _is_spared(trial):
            super().on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        if _is_spared(trial):
            return TrialScheduler.CONTINUE
        return super().on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        if not _is_spared(trial):
            super().on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        if not _is_spared(trial):
            super().on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        if not _is_spared(trial):
            super().on_trial_error(tune_controller, trial)


class SparingASHA(_Sparing, AsyncHyperBandScheduler):
    """Stop the sampler's trials early by ASHA, sparing reference trials and finalists."""


class SparingMedian(_Sparing, MedianStoppingRule):
    """Stop the sampler's trials early by the median rule, sparing reference trials and finalists."""


def unfinished(trials: Iterable[Any], main: int, stage: Finalists) -> int:
    """Count a search's trials that have not ended, finalists included once every other trial has ended."""
    done = ("TERMINATED", "ERROR")
    saved = list(trials)
    search = [t for t in saved if finalist_of(t.config or {}) is None]
    finals = [t for t in saved if finalist_of(t.config or {}) is not None]
    left = max(main - sum(t.status in done for t in search), 0)
    if not stage.on:
        return left
    if left:
        return left + stage.trials
    ends = [ended(t.config or {}, t.last_result, t.status == "ERROR") for t in search]
    expected = expected_trials(ends, [t.config for t in finals], stage)
    return max(expected - sum(t.status in done for t in finals), 0)
