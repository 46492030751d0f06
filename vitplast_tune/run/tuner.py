"""Build or restore a plan's Ray Tune ``Tuner``: its search algorithm, scheduler and Tune's settings while it runs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

from vitplast_tune import environment
from vitplast_tune._compat import ray_tune
from vitplast_tune.log import quieted
from vitplast_tune.plan.finalists import finalist_seeds
from vitplast_tune.plan.search_plan import SearchPlan
from vitplast_tune.records import tracking
from vitplast_tune.run import finalists, guard, optuna_search, parallel, schedulers, variants
from vitplast_tune.space.baselines import references
from vitplast_tune.space.files import SearchSpec

if TYPE_CHECKING:
    from ray.tune.search import SearchAlgorithm, Searcher


def search_algorithm(
    spec: SearchSpec,
    seed: int,
    max_concurrent: int | None = None,
    warm_start: Sequence[str] = (),
    finalist_seeds: Sequence[int] = (),
) -> Searcher | SearchAlgorithm:
    """Make the space's search algorithm: Optuna's, or Tune's variant generator for grid and random spaces.

    Args:
        spec: The space.
        seed: The algorithm's seed.
        max_concurrent: The most trials running at once (None: no limit).
        warm_start: Subsets ranked best first, of which TPE tries ``spec.warm_start`` first.
        finalist_seeds: The seeds of the space's finalists stage, if it has one.

    Returns:
        The searcher, or the variant generator.
    """
    if spec.algorithm != "optuna":
        return variants._variant_generator(spec, seed, max_concurrent)
    searcher = optuna_search._optuna_searcher(spec, seed, warm_start)
    made = references(spec.parameters, spec.baselines)
    if spec.finalists.on or made:
        searcher = finalists.StagedSearcher(searcher, spec.num_samples, spec.finalists, finalist_seeds, made)
    if max_concurrent:
        from ray.tune.search import ConcurrencyLimiter

        return ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)
    return searcher


PENDING_ENV = "TUNE_MAX_PENDING_TRIALS_PG"
TUNE_SETTINGS = {  # Ray Tune's settings while a search runs (``tune_environment``)
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    "RAY_AIR_NEW_OUTPUT": "0",  # the old reporter, silent at verbose=0: the new one prints its banner whatever
}
KEEP_CHECKPOINTS = (
    2  # per trial (RunConfig's CheckpointConfig): its latest and the one before, which Tune's state may name
)


def _pending_trials(plan: SearchPlan, cluster_grows: bool) -> int | None:
    """Return how many trials Tune may keep waiting for resources at once, or None for Tune's default."""
    if not cluster_grows or plan.spec.algorithm != "optuna":
        return None
    return plan.max_concurrent or plan.spec.total_trials


@contextlib.contextmanager
def tune_environment(plan: SearchPlan, cluster_grows: bool) -> Iterator[dict[str, str]]:
    """Set Ray Tune's and MLflow's variables for this search while it runs, a user's value kept, and yield them."""
    wanted = dict(TUNE_SETTINGS)
    wanted.update(tracking.BOUNDED_ENV)  # MLflow's calls bounded: a tracking server that stops is noticed (guard)
    if (pending := _pending_trials(plan, cluster_grows)) is not None:
        wanted[PENDING_ENV] = str(pending)
    wanted = {key: value for key, value in wanted.items() if not environment.is_set(key)}
    os.environ.update(wanted)
    try:
        yield wanted
    finally:
        for key in wanted:
            os.environ.pop(key, None)


def unfinished(location: str, spec: SearchSpec) -> int:
    """Count a search's trials, finalists included, that have not ended, from the state Tune saved at ``location``."""
    from ray.tune import ExperimentAnalysis

    with quieted(ray_tune.EXPERIMENT_ANALYSIS_LOGGER):  # not "failed to fetch metrics" of held-back trials
        trials = ExperimentAnalysis(location).trials
    return finalists.unfinished(trials, spec.total_trials, spec.finalists)


def saved_trials(location: str) -> dict[str, str] | None:
    """Return each trial of the experiment state Tune saved at ``location`` and its status, or None."""
    from ray.tune import ExperimentAnalysis

    if not tune.Tuner.can_restore(location):
        return None
    with quieted(ray_tune.EXPERIMENT_ANALYSIS_LOGGER):
        return {t.trial_id: t.status for t in ExperimentAnalysis(location).trials}


def restore(location: str, trainable) -> tune.Tuner:
    """Restore the Tuner of an interrupted search at ``location``, to run its unfinished and errored trials."""
    with quieted(ray_tune.EXPERIMENT_ANALYSIS_LOGGER):  # not "failed to fetch metrics" of held-back trials
        return tune.Tuner.restore(location, trainable=trainable, resume_unfinished=True, resume_errored=True)


def _trial_dirname(trial) -> str:
    """Name a trial's folder ``trial_<id>``."""
    return f"trial_{trial.trial_id}"


def tuner(plan: SearchPlan, trainable, callbacks: list, warm_start: Sequence[str] = ()) -> tune.Tuner:
    """Restore the plan's Tuner with ``--resume``, else build a new one."""
    spec = plan.spec
    # Ray Tune's default loggers (each trial's progress.csv and result.json) without its TensorBoard logger: fit
    # the Tuner inside tune_environment.
    callbacks = guard.watched([*callbacks, CSVLoggerCallback(), JsonLoggerCallback()])  # OS errors stop the search
    path = plan.location
    if plan.running.resume and tune.Tuner.can_restore(path):
        restored = restore(path, trainable)
        renew_run_config(restored, callbacks, plan.max_failures)
        return restored
    param_space: dict[str, Any] = {} if spec.algorithm == "optuna" else variants.tune_param_space(spec)
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=spec.metric,
            mode=spec.mode,
            num_samples=spec.total_trials
            if variants.grid_points(spec)
            else spec.num_samples + len(references(spec.parameters, spec.baselines)) + spec.finalists.trials,
            reuse_actors=True,
            search_alg=search_algorithm(
                spec, plan.seed, concurrency(plan), warm_start, finalist_seeds(spec, plan.settings.seed)
            ),
            scheduler=schedulers.scheduler(spec, plan.settings.max_steps),
            trial_dirname_creator=_trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=plan.name,
            storage_path=plan.storage,
            callbacks=callbacks,
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=plan.max_failures),
            # Two checkpoints per trial, not one: Tune's saved state can lag a trial's newest checkpoint, and a driver
            # killed then resumes from the one before; with one kept, that one is gone ("Could not recover from
            # checkpoint"; docs/results/quickstart-2026-12-03.md). The latest holds the best weights too.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=KEEP_CHECKPOINTS),
        ),
    )


def concurrency(plan: SearchPlan) -> int | None:
    """Return the most trials at once: ``--max-concurrent``, else what the cluster holds for several workers."""
    if plan.max_concurrent:
        return plan.max_concurrent
    import ray

    return parallel.concurrent_runs(plan.running.resources, ray.cluster_resources())


def renew_run_config(restored: tune.Tuner, callbacks: list, max_failures: int) -> None:
    """Give a restored Tuner this driver's callbacks and failure budget."""

    def renew(run_config: tune.RunConfig) -> tune.RunConfig:
        run_config.callbacks = list(callbacks)
        run_config.failure_config = tune.FailureConfig(max_failures=max_failures)
        return run_config

    ray_tune.renew_run_config(restored, renew)
