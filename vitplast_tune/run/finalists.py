"""The stages around a search's sampler as Ray Tune runs them: a searcher that suggests the baselines' reference trials
first (``space.baselines``), then the sampler's, then the finalists as trials of the same search once those have
ended (``space.finalists`` chooses them; ``StagedSearcher``), schedulers that never stop a reference trial or a
finalist early nor rank the sampler's trials against one (``SparingASHA``, ``SparingMedian``), and how many trials a
search stopped midway left unfinished, finalists included (``unfinished``).

Tune saves the searcher with the experiment's state (``get_state``: its wrappers' state beside the base searcher's
own), so a search resumed after Ctrl-C, SIGTERM or SIGKILL neither repeats a finalist nor loses one: those Tune saved
resume as any trial, the rest are suggested once.
"""

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
    """A searcher that suggests the baselines' reference trials (``references``), then the search's ``main`` trials by
    ``searcher`` (TPE), waits until every one of them has ended, then suggests the finalists
    (``space.finalists.choose``, from the reference trials and TPE's) and then no more (``Searcher.FINISHED``).

    The reference trials' and the finalists' reports and ends are not passed on: TPE learns from its own trials only.

    Args:
        searcher: The search's own searcher.
        main: How many trials ``searcher`` suggests.
        stage: The finalists stage.
        seeds: The seeds the finalists train on.
        references: The configs of the reference trials (``space.baselines.references``).
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
        """Pass Tune's metric, mode and config to the search's searcher (see ``Searcher``)."""
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> dict | None:
        """The next trial's config: each reference trial's; then the search's searcher's until ``main`` are suggested;
        then None (wait) until they have all ended; then each finalist's; then ``Searcher.FINISHED``.

        Args:
            trial_id: The id of the trial to make.

        Returns:
            Its config, None to wait, or ``Searcher.FINISHED``.
        """
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
        """Pass a report of one of the searcher's trials on (a reference trial's or a finalist's is not).

        Args:
            trial_id: The trial's id.
            result: Its report.
        """
        if self._sampled(trial_id):
            self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Note a search trial's end (for the finalists' choice, until it is made) and pass one of the searcher's on;
        a finalist's end is Tune's alone.

        Args:
            trial_id: The trial's id.
            result: Its last report (None: none).
            error: Whether it ended with an error.
        """
        if trial_id not in self.configs:
            return
        if self.planned is None:
            self.ended[trial_id] = ended(self.configs[trial_id], result, error)
        if self._sampled(trial_id):
            self.searcher.on_trial_complete(trial_id, result=result, error=error)

    def _sampled(self, trial_id: str) -> bool:
        """Whether a trial is one the search's searcher suggested (not a reference trial nor a finalist)."""
        return trial_id in self.configs and stage_of(self.configs[trial_id]) == SEARCH

    def get_state(self) -> dict:
        """This wrapper's state, without its searcher's (Tune saves that apart)."""
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k != "searcher"})

    def set_state(self, state: dict) -> None:
        """Restore this wrapper's state (``get_state``)."""
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        """Save the search's searcher (see ``Searcher.save``)."""
        self.searcher.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        """Restore the search's searcher (see ``Searcher.restore``)."""
        self.searcher.restore(checkpoint_path)


def is_spared(trial: Trial) -> bool:
    """Whether a Tune trial is a baseline's reference trial or a finalist (its config marked by
    ``space.baselines.references`` or ``space.finalists.choose``): one no scheduler stops early."""
    return stage_of(getattr(trial, "config", None) or {}) != SEARCH  # a replay's trials may have no config


class _Sparing(TrialScheduler):
    """A scheduler's early stopping kept off the reference trials and the finalists: each runs to its budget, the
    budget the answer compares at, and none counts in the rungs or medians of the sampler's trials."""

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        if not is_spared(trial):
            super().on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        if is_spared(trial):
            return TrialScheduler.CONTINUE
        return super().on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        if not is_spared(trial):
            super().on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        if not is_spared(trial):
            super().on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        if not is_spared(trial):
            super().on_trial_error(tune_controller, trial)


class SparingASHA(_Sparing, AsyncHyperBandScheduler):
    """ASHA over the sampler's trials; every reference trial and finalist runs to its budget (``_Sparing``)."""


class SparingMedian(_Sparing, MedianStoppingRule):
    """Median stopping over the sampler's trials; every reference trial and finalist runs to its budget
    (``_Sparing``)."""


def unfinished(trials: Iterable[Any], main: int, stage: Finalists) -> int:
    """How many of a search's trials, finalists included, have not ended.

    Args:
        trials: The trials Tune saved (each with ``status``, ``config`` and ``last_result``).
        main: How many trials the search runs before its finalists (its reference trials included).
        stage: Its finalists stage.

    Returns:
        The search's trials not ended (never made, or stopped), and its finalists not ended; the finalists are
        counted once every trial of the search has ended (``space.finalists.expected_trials``).
    """
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
