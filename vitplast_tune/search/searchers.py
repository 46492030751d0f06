"""The Ray Tune machinery a plan asks for: the search algorithm, the early-stopping scheduler, pending
trials for autoscaling, and the Tuner.

``tuner(plan, trainable, callbacks)`` builds a new Tuner (or restores one for ``--resume``);
``scheduler(spec, max_steps)`` and ``OptunaSearcher`` are public for the benchmarks that replay searches.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
from ray.tune.search.optuna import OptunaSearch

from vitplast_tune.search import distributions, spaces
from vitplast_tune.search.plan import SearchPlan


class OptunaSearcher(OptunaSearch):
    """Ray Tune's OptunaSearch, telling Optuna the truth about each trial's end.

    Every evaluation is an intermediate value at its training step. A trial that reached its budget
    (``max_steps``) is COMPLETE; one the scheduler stopped earlier is PRUNED, so TPE does not take
    its truncated accuracy for a final one; one that errored or diverged is FAIL (the stock searcher
    reports both as COMPLETE with their last value).
    """

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Report the metric to the Optuna trial at the training step (a resumed step is reported once)."""
        if isinstance(self.metric, list):  # several objectives: Optuna takes no intermediate values
            return
        value, step = result.get(self.metric), result.get("step")
        if trial_id in self._completed_trials or trial_id not in self._ot_trials or step is None:
            return
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        with warnings.catch_warnings():  # Optuna warns and ignores a step reported again after a restore
            warnings.simplefilter("ignore")
            self._ot_trials[trial_id].report(float(value), int(step))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """End the Optuna trial: FAIL (errored or diverged), PRUNED (stopped before max_steps) or COMPLETE."""
        if error or (result or {}).get("diverged"):
            return super().on_trial_complete(trial_id, result=None, error=True)
        if result and result.get("step", 0) < result.get("max_steps", 0) and trial_id in self._ot_trials:
            if trial_id not in self._completed_trials:
                import optuna

                self._ot_study.tell(self._ot_trials[trial_id], state=optuna.trial.TrialState.PRUNED)
                self._completed_trials.add(trial_id)
            return
        super().on_trial_complete(trial_id, result=result, error=error)


def scheduler(spec: spaces.SearchSpec, max_steps: int):
    """The space's early-stopping rule over training steps: ASHA, median stopping, or none (FIFO)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

    s = spec.scheduler
    if s.name == "asha":
        return ASHAScheduler(
            time_attr="step", max_t=max_steps, grace_period=s.grace_period, reduction_factor=s.reduction_factor
        )
    if s.name == "median":
        return MedianStoppingRule(time_attr="step", grace_period=s.grace_period)
    return FIFOScheduler()


def objectives(spec: spaces.SearchSpec) -> tuple[str | list[str], str | list[str]]:
    """OptunaSearch's ``metric`` and ``mode``: one each, or lists for a multi-objective space (Optuna's Pareto front).

    Tune's scheduler and result grid still use ``spec.metric`` (the first objective); a multi-objective
    space has no early stopping (``spaces`` refuses ASHA and median stopping for it).
    """
    if not spec.multi_objective:
        return spec.metric, spec.mode
    return [m for m, _ in spec.objectives], [d for _, d in spec.objectives]


def warm_start_points(spec: spaces.SearchSpec, subsets: Sequence[str]) -> list[dict[str, Any]]:
    """TPE's first trials (OptunaSearch ``points_to_evaluate``, i.e. Optuna's ``enqueue_trial``): the first
    ``spec.warm_start`` of ``subsets`` as the space's component flags; the other parameters are sampled."""
    return [distributions.component_flags(subset) for subset in list(subsets)[: spec.warm_start]]


def search_algorithm(
    spec: spaces.SearchSpec, seed: int, max_concurrent: int | None = None, warm_start: Sequence[str] = ()
):
    """Optuna TPE over the space (define-by-run), or Tune's variant generator for grid and random spaces.

    ``warm_start``: subsets ranked best first (``recommend``), of which TPE tries ``spec.warm_start`` first.
    """
    if spec.algorithm == "optuna":
        import optuna
        from optuna.samplers import TPESampler

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        metric, mode = objectives(spec)
        points = warm_start_points(spec, warm_start) or None
        space, sampler = distributions.OptunaSpace(spec.parameters), TPESampler(seed=seed)
        searcher = OptunaSearcher(space=space, metric=metric, mode=mode, sampler=sampler, points_to_evaluate=points)
        if max_concurrent:
            from ray.tune.search import ConcurrencyLimiter

            return ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)
        return searcher
    from ray.tune.search import BasicVariantGenerator

    points = spaces.grid_points(spec)
    return BasicVariantGenerator(random_state=seed, max_concurrent=max_concurrent or 0, points_to_evaluate=points)


PENDING_ENV = "TUNE_MAX_PENDING_TRIALS_PG"


def pending_trials(plan: SearchPlan, cluster_grows: bool) -> int | None:
    """How many trials Tune may keep waiting for resources at once, or None to leave Tune's default.

    Ray Tune 2.60 lets a searcher other than its variant generator keep one trial pending (or a
    ConcurrencyLimiter's ``max_concurrent``; ray-project/ray#43451), so an autoscaler sees one request at
    a time and adds one node per trial. On a cluster that can grow, the search's concurrency is pending
    at once: ``--max-concurrent``, else every trial of the search. On a fixed cluster (a local Ray
    instance) one pending trial starts at once, and TPE keeps learning from the freshest results.
    """
    if not cluster_grows or plan.spec.algorithm != "optuna":
        return None
    return plan.max_concurrent or plan.spec.total_trials


@contextlib.contextmanager
def tune_environment(plan: SearchPlan, cluster_grows: bool) -> Iterator[dict[str, str]]:
    """Ray Tune's settings for this search, set while it runs and restored after (a value the user set wins).

    ``TUNE_MAX_PENDING_TRIALS_PG``: ``pending_trials``; ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS``: the Tuner's own
    CSV and JSON loggers replace Tune's defaults, whose TensorBoard logger imports torch into the driver (0.3 GB
    there for nothing: MLflow is this tool's record); no warning about syncing the experiment's state, which a
    search on local disk does at every trial's report. Yields the values it set.
    """
    wanted = {
        "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
        "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    }
    if (pending := pending_trials(plan, cluster_grows)) is not None:
        wanted[PENDING_ENV] = str(pending)
    wanted = {key: value for key, value in wanted.items() if key not in os.environ}
    os.environ.update(wanted)
    try:
        yield wanted
    finally:
        for key in wanted:
            os.environ.pop(key, None)


def unfinished(location: str, total: int) -> int:
    """How many of a search's ``total`` trials have not ended (never created or started, or stopped by Ctrl-C).

    Tune's cleanup marks the pending and running trials of an interrupted search TERMINATED in the grid it
    returns; the experiment state it saved just before says what they were. Counting the trials that ended
    there (TERMINATED or ERROR) ignores a trial a killed driver created but never started. ``location`` is the
    search's (``SearchPlan.location``), not the grid's path, which drops a URI's scheme and query.
    """
    import logging

    from ray.tune import ExperimentAnalysis

    quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")
    level, quiet.level = quiet.level, logging.ERROR  # "failed to fetch metrics" of trials that never ran
    try:
        statuses = [t.status for t in ExperimentAnalysis(location).trials]
    finally:
        quiet.setLevel(level)
    return max(total - sum(status in ("TERMINATED", "ERROR") for status in statuses), 0)


def trial_dirname(trial) -> str:
    """Short trial folder names ("trial_<id>") instead of Tune's config-laden ones."""
    return f"trial_{trial.trial_id}"


def tuner(plan: SearchPlan, trainable, callbacks: list, warm_start: Sequence[str] = ()) -> tune.Tuner:
    """The Tuner of a plan: restored from storage with ``--resume`` (with this run's callbacks), else new
    (``warm_start``: see search_algorithm)."""
    spec, options = plan.spec, plan.options
    # Ray Tune's default loggers (each trial's progress.csv and result.json) without its TensorBoard logger: fit
    # the Tuner inside tune_environment.
    callbacks = [*callbacks, CSVLoggerCallback(), JsonLoggerCallback()]
    path = plan.location
    if options.resume and tune.Tuner.can_restore(path):
        restored = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
        renew_run_config(restored, callbacks, plan.max_failures)
        return restored
    param_space: dict[str, Any] = {} if spec.algorithm == "optuna" else spaces.tune_param_space(spec)
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=spec.metric,
            mode=spec.mode,
            num_samples=spec.total_trials if spaces.grid_points(spec) else spec.num_samples,
            reuse_actors=True,
            search_alg=search_algorithm(spec, plan.seed, plan.max_concurrent, warm_start),
            scheduler=scheduler(spec, plan.settings.max_steps),
            trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=plan.name,
            storage_path=plan.storage,
            callbacks=callbacks,
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=plan.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        ),
    )


def renew_run_config(restored: tune.Tuner, callbacks: list, max_failures: int) -> None:
    """Give a restored Tuner this driver's callbacks and failure budget (Ray restores the pickled ones)."""

    def renew(run_config: tune.RunConfig) -> tune.RunConfig:
        run_config.callbacks = list(callbacks)
        run_config.failure_config = tune.FailureConfig(max_failures=max_failures)
        return run_config

    if getattr(restored, "_local_tuner", None) is not None:
        renew(restored._local_tuner.get_run_config())
        return
    import ray  # a Ray client (ray://) driver: the Tuner lives in an actor on the cluster

    remote = restored._remote_tuner
    ray.get(remote.set_run_config_and_remote_string_queue.remote(renew(ray.get(remote.get_run_config.remote())), None))
