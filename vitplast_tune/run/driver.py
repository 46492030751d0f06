"""Drive a search top to bottom: validate, start Ray, measure, record, tune, then its end phase; never import torch."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from vitplast_tune import storage
from vitplast_tune.analysis.analyze import analyze_search
from vitplast_tune.errors import SearchFailed, SearchInterrupted, option, trial_cause
from vitplast_tune.log import get_logger
from vitplast_tune.plan.options import SearchOptions
from vitplast_tune.plan.planner import prepare
from vitplast_tune.plan.resume import resume_command
from vitplast_tune.plan.search_plan import Running, SearchPlan
from vitplast_tune.predictors.report import Predictors
from vitplast_tune.recommend import ranking
from vitplast_tune.records import best_trial, finalists, pareto, search_run, study, tracking, trial_runs
from vitplast_tune.records.search import Search
from vitplast_tune.records.table import metric_curves, search_trials, trial_result, trial_table, write_trials
from vitplast_tune.records.view import ui_command
from vitplast_tune.run import before_trials, guard, interrupts, nodes, parallel, tuner
from vitplast_tune.run.live_study import LiveStudy
from vitplast_tune.run.trainable import train_trial
from vitplast_tune.space.objectives import objective_of
from vitplast_tune.storage import spoken, write_record
from vitplast_tune.timings import Timings
from vitplast_tune.type_checks import checked

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = get_logger(__name__)


def run(
    options: SearchOptions,
    callbacks: Sequence[Callback] = (),
    timings: Timings | None = None,
    trainable: Callable[..., Any] | None = None,
) -> Search:
    """Validate the options into a plan, then run or resume the search.

    Args:
        options: How the search runs.
        callbacks: Extra Ray Tune callbacks.
        timings: Phases timed before this call, continued here.
        trainable: What each trial runs instead of the default.

    Returns:
        The finished search.

    Raises:
        UserError: The options do not make a valid plan.
        SearchInterrupted: The search was stopped.
    """
    timings = timings or Timings()
    with interrupts.before_start(options.resume):  # Ctrl-C or SIGTERM: one line, 130 or 143, as later
        with timings.phase("checks"):
            plan = prepare(options)
        return execute(plan, callbacks, timings, trainable)


@dataclass
class _Records:
    """Hold what a running search has recorded so far: client, parent run, record written, trials ended."""

    mlflow: Any = None
    parent: str | None = None
    written: bool = False
    ended: bool = False
    orphans: dict | None = None  # resumed: the runs of trials Tune never saved (``trial_runs.reconcile``)


@dataclass
class _Tuned:
    """Hold what the trials left for the end phase: the result grid, the predictors, the view, the staged files."""

    grid: Any
    predictors: Predictors
    view: Any
    staged: list


def execute(
    plan: SearchPlan,
    callbacks: Sequence[Callback] = (),
    timings: Timings | None = None,
    trainable: Callable[..., Any] | None = None,
) -> Search:
    """Run a prepared search, then its end phase, holding its lock, and shut Ray down after.

    Args:
        plan: The prepared search.
        callbacks: Extra Ray Tune callbacks.
        timings: Where the seconds of each phase are added.
        trainable: The trainable each trial runs instead of ``run.trainable.train_trial``.

    Returns:
        The finished search.

    Raises:
        SearchInterrupted: Ctrl-C, SIGTERM or an OS error stopped it; the error holds the command that resumes it.
    """
    try:
        with guard.guarded(plan):
            return _execute(plan, callbacks, timings, trainable)
    except OSError as exc:  # its folder, lock or space held back on a full disk: nothing started
        if (fault := guard.named_fault(exc, [plan.local_dir or plan.results_dir])) is None:
            raise
        raise _interrupted(plan, _Records(written=plan.running.resume), fault=f"{fault}, while locking") from None


def _execute(plan: SearchPlan, callbacks: Sequence[Callback], timings: Timings | None, trainable) -> Search:
    """Run ``execute`` with the search's lock held and its OS faults watched."""
    import ray

    started, timings = time.perf_counter() - (timings.total if timings else 0.0), timings or Timings()
    for note in plan.notes:
        log.info(f"note: {note}")
    records = _Records(written=plan.running.resume)
    with interrupts.handled():
        owns_ray = not ray.is_initialized()
        try:  # start or join Ray, check the trial request, measure, record, tune, end; Ray shut down after
            if owns_ray:
                from vitplast_tune.run import cluster

                with timings.phase("ray_start"), interrupts.starting_ray():  # SIGTERM as Ctrl-C, in ray.init too
                    cluster.join_or_start(plan.running.joining, plan.running.connect_timeout_s, plan.running.address)
            interrupts.on_sigterm_interrupt()  # after ray.init, which installs its own SIGTERM handler
            tuned = _record_and_tune(plan, callbacks, records, timings, trainable)
            _check_ended(plan, records)
            with interrupts.deferred():  # every trial ended: SIGTERM waits for the results (Ctrl-C still stops)
                result = _finish(plan, tuned, records, timings, started)
        except KeyboardInterrupt:
            guard.close_stopped(records.mlflow, records.parent)
            raise _interrupted(plan, records) from None
        except SearchInterrupted:
            raise
        except Exception as exc:  # an OS fault (a full disk, ...), or another error whose closing of the runs met one
            if guard.stopped_by(exc, "the driver recorded the search") or not guard.closed_as_failed(
                records.mlflow, records.parent, exc
            ):
                guard.close_stopped(records.mlflow, records.parent)
                raise _interrupted(plan, records, "stopped before its trials ended") from None
            raise
        finally:
            if owns_ray:
                with timings.phase("ray_stop"):
                    ray.shutdown()
    return result


def _check_ended(plan: SearchPlan, records: _Records) -> None:
    """Check that every trial ended, else close the runs as KILLED and raise SearchInterrupted."""
    unfinished = tuner.unfinished(plan.location, plan.spec)
    if unfinished or guard.current_fault():
        guard.close_stopped(records.mlflow, records.parent)
        raise _interrupted(plan, records, f"{unfinished} trial(s) unfinished")
    records.ended = True


def _finish(plan: SearchPlan, tuned: _Tuned, records: _Records, timings: Timings, started: float) -> Search:
    """Run the end phase: record the results, build the best model, complete the study, analyze, and end the parent."""
    mlflow, parent = records.mlflow, records.parent
    if records.orphans:
        trial_runs.retire(mlflow, records.orphans)  # runs of trials Tune never saved, taken up by none
    with timings.phase("results"):
        table = trial_table(tuned.grid, plan.settings, tuned.predictors)
        result = Search(plan.place, plan.record(parent), table, view=tuned.view, notes=list(plan.notes))
        result.spec, result.settings = plan.spec, plan.settings
        _record_results(result, mlflow, tuned.grid)
    _check_some_reported(plan, table, tuned.grid)
    running = plan.running
    release = parallel.release_orphans if running.resources.workers > 1 else None  # what stopped trials held
    with before_trials.measuring_worker(
        running.resources.request, doing="building the best model", while_waiting=release
    ) as runner:
        with timings.phase("best_model"):
            _record_best(result, mlflow, tuned.grid, runner, tuned.staged)
        with timings.phase("study"):
            record_study(result, mlflow, tuned.grid)
        with timings.phase("analysis"):
            measuring = {"runner": runner, "decoded": plan.decoded, "staged": tuned.staged}
            analyze(result, mlflow, running, measuring=measuring, once=True)
    result.timings, result.elapsed_s = timings, time.perf_counter() - started  # as the summary and status say it
    mlflow.log_dict(parent, timings.seconds, "timings.json")
    mlflow.log_metric(parent, tracking.ELAPSED_METRIC, result.elapsed_s)
    mlflow.set_terminated(parent, status="FINISHED")
    return result


def _check_some_reported(plan: SearchPlan, table, grid) -> None:
    """Raise SearchFailed, naming the first trial's cause, when no trial reported a validation accuracy."""
    if not table.empty and table["best_val_acc"].notna().any():
        return
    errors = [r.error for r in sorted(grid, key=lambda r: str(getattr(r, "path", ""))) if r.error is not None]
    cause = trial_cause(errors[0]) if errors else "none failed, yet none reported a validation accuracy"
    raise SearchFailed(
        f'no trial of search "{plan.name}" reported a validation accuracy: {len(errors)} of {len(table)} failed, the '
        f"first with {cause}; fix that and start the search again (another {option('name')}); its records: "
        f"{plan.results_dir}"
    )


def _record_and_tune(
    plan: SearchPlan, callbacks: Sequence[Callback], records: _Records, timings: Timings, trainable=None
) -> _Tuned:
    """Check the trial request, measure the predictors, open the parent run and write the record, then tune."""
    with timings.phase("ray_start"):
        grows, staged = nodes.stage_inputs(plan)
    # The predictors, in one Ray worker with a trial's resources (a GPU when trials use GPUs); cached plasticity reused.
    predictors = before_trials.measure_predictors(plan, staged, timings)
    with timings.phase("records"):
        place = plan.place
        records.mlflow = tracking.client(plan.tracking_uri)
        records.parent = search_run.open_search_run(
            records.mlflow, place, plan.spec, plan.settings, predictors, seed=plan.seed, resume=plan.running.resume
        )
        cost = objective_of(plan.spec) != "accuracy"
        view = search_run.publish_view(records.mlflow, place, records.parent, predictors.plasticity is not None, cost)
        serves = f"; {command} serves it" if (command := ui_command(place)) else ""
        log.info(f"MLflow view (fills in as trials report{serves}): {view.link}")
        if view.note:
            log.info(f"  ({view.note})")
        if plan.local_dir is not None:
            write_record(plan.local_dir, plan.record(records.parent))
        records.written = True
    saved = tuner.saved_trials(plan.location) if plan.running.resume else None
    if saved is not None:  # each trial keeps one run, none is left RUNNING
        records.orphans = trial_runs.reconcile(records.mlflow, records.parent, saved)
    with tuner.tune_environment(plan, grows), timings.phase("trials"):
        grid = _tune(plan, callbacks, records.parent, predictors, staged, trainable, records.orphans)
    return _Tuned(grid, predictors, view, list(staged))


def _interrupted(
    plan: SearchPlan, records: _Records, what: str = "stopped before its trials ended", fault: str | None = None
) -> SearchInterrupted:
    """Make the SearchInterrupted of a stopped search, saying how to resume it or that nothing was recorded."""
    fault = fault or guard.current_fault()
    fix, fault_exit = guard.current_fix()
    if fault:
        what = f"{fault}: {what}"
    else:
        fix = ""
    if not records.written:
        text = f"{what}{interrupts.NOTHING_RECORDED}; {fix}run the same command again"
    elif records.ended:
        text = (
            "stopped while it recorded its results (every trial had ended); nothing is lost and no trial runs again: "
            f"{fix}finish it with {resume_command(plan)}"
        )
    else:
        text = f"{what}; nothing is lost: {fix}continue the search with {resume_command(plan)}"
    return SearchInterrupted(text, fault_exit if fault else interrupts.exit_code())


def _tune(
    plan: SearchPlan,
    callbacks: Sequence[Callback],
    parent: str,
    predictors: Predictors,
    staged=(),
    trainable=None,
    orphans: dict | None = None,
):
    """Run the trials with the tracker, the live study, progress lines and ``callbacks``, and return Tune's grid."""
    from ray import tune

    describe = trial_runs.trial_describer(plan.name, plan.settings, predictors)
    tracker = trial_runs.MlflowTracker(plan.tracking_uri, parent, describe, orphans)
    live = LiveStudy(plan.results_dir, plan.name, plan.spec, plan.settings, run_of=tracker.runs.get)
    live.setup()  # the study made before its command is printed: a dashboard opened then must not race its making
    log.info(f"Optuna study (fills in as trials end): optuna-dashboard {spoken(live.url)}   (study '{plan.name}')")
    callbacks = [tracker, live, *callbacks]
    if plan.running.verbose:
        from vitplast_tune.run.progress import Progress

        callbacks.append(Progress(plan.spec.total_trials, finalists=plan.spec.finalists.trials))
    if plan.running.resources.workers > 1:
        callbacks.append(parallel.ReleaseOrphans())  # the resources of a stopped trial's Train run, for the next
    if trainable is None:
        trainable = tune.with_parameters(
            train_trial,
            settings=plan.settings,
            decoded=plan.decoded,
            max_trainable_params=plan.max_trainable_params,
            staged=list(staged),
            workers=parallel.trial_workers(
                plan.running.resources,
                max_failures=plan.max_failures,
                storage=storage.join(plan.location, parallel.TRAIN_RUNS),
            ),
        )
    trainable = tune.with_resources(trainable, parallel.trial_request(plan.running.resources))  # several: a Train run's
    warm_start = _warm_start(plan, predictors)
    try:
        return tuner.tuner(plan, trainable, callbacks, warm_start).fit()
    finally:
        interrupts.restore_ctrl_c()  # Tune leaves its SIGINT handler, which nothing reads once fit returns


def _warm_start(plan: SearchPlan, predictors: Predictors) -> list[str]:
    """Return the subsets ``recommend`` ranks best for a space with ``warm_start``, else none."""
    if not plan.spec.warm_start or predictors.plasticity is None:
        return []
    ranked = ranking.warm_start_subsets(predictors, plan.settings, plan.storage, plan.max_trainable_params)
    log.info(f"Warm start: TPE tries first {', '.join(ranked[: plan.spec.warm_start])}")
    return ranked


def analyze(
    result: Search,
    mlflow: MlflowClient,
    running: Running | None = None,
    measuring: dict | None = None,
    once: bool = False,
) -> None:
    """Run every analysis the search supports on its non-finalist trials and log it to the parent run.

    Args:
        result: The finished search.
        mlflow: The MLflow client of its tracking store.
        running: The plasticity reference, variant and pairs to measure with (None: the defaults).
        measuring: Where its measurements run.
        once: Whether a table the parent run already holds is left unlogged.
    """
    spec, found, o = result.spec, search_trials(result.table), running or Running.of(SearchOptions())
    parameters = None if found.empty else (study.parameter_table(found, spec), study.study_parameters(spec))
    result.analysis = analyze_search(
        found,
        spec,
        result.settings,
        result.place.results_dir / "analysis",
        reference=o.plasticity_reference,
        plasticity_pairs=o.plasticity_pairs,
        parameters=parameters,
        variant=o.plasticity_variant,
        measuring=measuring,
    )
    search_run.log_analysis(mlflow, result.parent_run_id, result.analysis, once=once)


def record_study(result: Search, mlflow, grid) -> None:
    """Add the trials its live study lacks to the search's Optuna study, and name the study on the parent run."""
    if result.table is None or result.table.empty:
        return
    spec = result.spec
    curves = metric_curves(grid, [m for m, _ in spec.objectives] or [spec.metric])
    study.write_study(result.directory, result.name, spec, result.table, curves)
    url = study.storage_url(result.directory)
    mlflow.set_tag(result.parent_run_id, tracking.STUDY_TAG, f"{url} (study {result.name})")


def _record_results(result: Search, mlflow, grid) -> None:
    """Record each trial's run id and metrics, the trial table, the headline metrics and the Pareto fronts."""
    table = result.table
    if not table.empty:
        table["run_id"] = table["trial_id"].map(tracking.trial_runs(mlflow, result.parent_run_id))
        trial_runs.log_trial_finals(mlflow, table, tracking.start_ms(mlflow, result.parent_run_id))
    best = finalists.answer_trial(table, result.spec)  # the answer's configuration (its finalists' choice, if any)
    path = write_trials(table, result.place.local_dir)
    if path is not None:
        search_run.log_results(mlflow, result.parent_run_id, path, best, len(table))
    fronts = pareto.write_pareto(table, result.place.results_dir / "analysis")
    tracking.log_artifacts(mlflow, result.parent_run_id, fronts, "pareto")
    search_run.log_cost(mlflow, result.parent_run_id, table, objective_of(result.spec))


def _record_best(result: Search, mlflow, grid, runner, staged=()) -> None:
    """Log the answer's trial weights and its model, built by ``runner`` in a Ray worker."""
    best = finalists.answer_trial(result.trials, result.spec)
    found = trial_result(grid, best.iloc[0]["trial_id"]) if not best.empty else None
    if found is None or found.checkpoint is None:
        return
    row = best.iloc[0].to_dict()
    uri, note = best_trial.log_best_trial(
        mlflow, result.settings, result.place, result.parent_run_id, found, row, runner, staged
    )
    result.best_model_uri = uri
    result.best_run_id = row.get("run_id") if isinstance(row.get("run_id"), str) else None
    if note:
        log.info(f"note: {note}")


@checked()
def run_search(options: SearchOptions | None = None, /, **keywords: Any) -> Search:
    """Run or resume a search and return it as its records hold it.

    Args:
        options: The search's ``SearchOptions`` (default: every option's default).
        **keywords: Options under the command line's names, replacing those of ``options``.

    Returns:
        The finished ``Search``: its trials, study, MLflow runs and best model.

    Raises:
        UserError: An option, the space, an input or a service is bad; raised before Ray starts.
        SearchInterrupted: The search was stopped; its message says how to resume it.
    """
    return run(SearchOptions.of(options, **keywords))
