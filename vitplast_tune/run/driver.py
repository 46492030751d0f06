"""The search's driver, top to bottom: validate -> start or join Ray -> measure the predictors -> record -> tune ->
results -> the best model -> the Optuna study -> analyze, Ray up until the end. It never imports torch: trials, the
measurements and the best model run in Ray workers.

``run(options)`` is the whole job (``run_search``, the package's, returns its ``Search``); ``execute(plan)`` runs a
prepared plan. Each step is one call into the module that owns it: ``plan`` (validation), ``run.cluster`` and
``run.nodes`` (Ray), ``run.before_trials`` (plasticity, gradient table), ``records`` (MLflow, the trial table, the
Optuna study, the summary), ``run.tuner`` (the Tuner) and ``analysis`` (statistics, plots).
"""

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
from vitplast_tune.typed import checked

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = get_logger(__name__)


def run(
    options: SearchOptions,
    callbacks: Sequence[Callback] = (),
    timings: Timings | None = None,
    trainable: Callable[..., Any] | None = None,
) -> Search:
    """Validate the options into a plan, then run (or resume) the search and return its trials.

    Args:
        options: How the search runs.
        callbacks: Extra Ray Tune callbacks (see ``execute``).
        timings: Phases timed before this call (e.g. the command line's imports), continued here.
        trainable: What each trial runs instead of the default (see ``execute``).

    Returns:
        The finished search.

    Raises:
        UserError: The options do not make a valid plan (``prepare``).
        SearchInterrupted: The search was stopped (see ``execute``).
    """
    timings = timings or Timings()
    with interrupts.before_start(options.resume):  # Ctrl-C or SIGTERM: one line, 130 or 143, as later
        with timings.phase("checks"):
            plan = prepare(options)
        return execute(plan, callbacks, timings, trainable)


@dataclass
class _Records:
    """What a running search has recorded so far: the MLflow client, its parent run, whether its record is written,
    whether every trial has ended (what is left: the end phase)."""

    mlflow: Any = None
    parent: str | None = None
    written: bool = False
    ended: bool = False
    orphans: dict | None = None  # resumed: the runs of trials Tune never saved (``trial_runs.reconcile``)


@dataclass
class _Tuned:
    """What the trials left for the end phase: Tune's result grid, the predictors, the view, the staged files."""

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
    """Run a prepared search, then its end phase, with Ray shut down after.

    In order: Ray, the predictors, the MLflow parent run, the Tuner, then the end phase (results, the best model, the
    Optuna study, the analysis). Ctrl-C or SIGTERM (``interrupts``) stops it as Tune's graceful stop does, closes its
    runs as KILLED and raises SearchInterrupted with the command that resumes it; so does an OS error such as a full
    disk (``guard``), and in the end phase too, which that command then finishes without running a trial again. Its
    lock is held while it runs: a second driver of the search is refused.

    Args:
        plan: The prepared search.
        callbacks: Extra Ray Tune callbacks (e.g. the trial timeline of ``python -m benchmarks.trial``).
        timings: Where the seconds of each phase are added (the result's ``timings``).
        trainable: The Ray Tune trainable each trial runs instead of ``run.trainable.train_trial`` with the plan's
            settings (e.g. the cheap stand-in with which ``benchmarks.scale`` measures the driver alone).

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
    """``execute`` with the search's lock held and its OS faults watched."""
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
    """Every trial ended (Tune's saved state says so), else the search was stopped: runs closed KILLED and
    SearchInterrupted raised."""
    unfinished = tuner.unfinished(plan.location, plan.spec)
    if unfinished or guard.current_fault():
        guard.close_stopped(records.mlflow, records.parent)
        raise _interrupted(plan, records, f"{unfinished} trial(s) unfinished")
    records.ended = True


def _finish(plan: SearchPlan, tuned: _Tuned, records: _Records, timings: Timings, started: float) -> Search:
    """The end phase, every trial ended: the results recorded (MLflow, trial table, Pareto fronts), the best model
    built in a Ray worker with a trial's resources and logged, the Optuna study completed, the analyses (that worker
    makes their measurements), then the parent run ended FINISHED. Each step writes what a resumed search lacks."""
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
    """SearchFailed, naming the first trial's cause, when no trial reported a validation accuracy (every one failed):
    a search without an answer is not a success (its parent run is then ended FAILED, ``_execute``)."""
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
    """Check the trial request on the cluster, measure the predictors, open the MLflow parent run and write the
    search's record (into ``records`` as they happen), then tune."""
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
    """The SearchInterrupted of a search stopped by Ctrl-C, SIGTERM or an OS fault (``fault``, else the guard's): how
    to resume (or finish) it, or that nothing was recorded."""
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
    """Run the trials (the MLflow tracker, the live Optuna study, progress lines and ``callbacks`` attached); return
    Tune's result grid. ``staged``: the driver's files the trials read, sent to their nodes (``data.staging``);
    ``trainable``: what each trial runs (default: ``train_trial`` with the plan's settings); ``orphans``: runs a
    trial of the same settings continues (``trial_runs.reconcile``)."""
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
    """The subsets ``recommend`` ranks best for a space with ``warm_start`` (TPE tries them first); else none."""
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
    """Run every analysis the search supports (see ``analysis.analyze.analyze_search``) and log it to the parent run.

    The analysis is of the search's trials, not its finalists (``space.finalists``); it is kept as ``result.analysis``.

    Args:
        result: The finished search.
        mlflow: The MLflow client of its tracking store.
        running: The plasticity reference, variant and pairs to measure with (None: ``SearchOptions``' defaults).
        measuring: Where its measurements run (``runner``, ``decoded``, ``staged``: see ``predictors.report``).
        once: Whether a table the parent run already holds is left unlogged (a resumed search's end).
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
    """Each trial's run id and final metrics on its run; the trial table as CSV in the search's directory, the
    headline metrics and the Pareto fronts on the parent run."""
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
    """The answer's trial (``records.finalists.answer_trial``): its weights on its run and the parent's, its model on
    the parent's (``records.best_trial``), built by ``runner`` (a Ray worker with a trial's resources)."""
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
    """Run (or resume) a search and return it as its records hold it (``vitplast_tune.run_search``).

    Args:
        options: the search's ``SearchOptions`` (default: every option's default).
        **keywords: options under the command line's names (``space``, ``name``, ``max_steps``, ``model``,
            ``dataset``, ...), replacing those of ``options``; ``space`` may be a shipped name, a path, a mapping of
            the space file's keys or a ``SearchSpec``.

    Returns:
        The finished ``Search`` (``records.search``): its trials, study, MLflow runs and best model.

    Raises:
        UserError: a bad option, space, input or service (one of its kinds), before Ray starts.
        SearchInterrupted: the search was stopped (Ctrl-C, SIGTERM); its message says how to resume it.
    """
    return run(SearchOptions.of(options, **keywords))
