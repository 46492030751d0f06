"""The search's driver, top to bottom: validate -> start or join Ray -> measure the predictors -> record -> tune ->
results -> analyze. It never imports torch: trials and measurements run in Ray workers.

``run(options)`` is the whole job; ``execute(plan)`` runs a prepared plan. Each step is one call into the module that
owns it: ``plan`` (validation), ``run.cluster`` and ``run.nodes`` (Ray), ``run.measure`` (plasticity, gradient
table), ``records`` (MLflow, the trial table, the Optuna study, the summary), ``run.tuner`` (the Tuner) and
``analysis`` (statistics, plots).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ray.tune import Callback

from vitplast_tune.analysis.analyze import analyze_search
from vitplast_tune.errors import SearchInterrupted
from vitplast_tune.log import get_logger
from vitplast_tune.plan.options import SearchOptions, SearchPlan
from vitplast_tune.plan.planner import prepare
from vitplast_tune.plan.resume import resume_command
from vitplast_tune.predictors.report import Predictors
from vitplast_tune.recommend import ranking
from vitplast_tune.records import best_trial, pareto, search_run, study, tracking, trial_runs, trials
from vitplast_tune.records.result import SearchResult, ui_command
from vitplast_tune.run import interrupts, measure, nodes, parallel, tuner
from vitplast_tune.run.trainable import train_trial
from vitplast_tune.storage import write_record
from vitplast_tune.timings import Timings

log = get_logger(__name__)


def run(options: SearchOptions, callbacks: Sequence[Callback] = (), timings: Timings | None = None) -> SearchResult:
    """Validate the options into a plan, then run (or resume) the search and return its trials.

    ``timings``: phases timed before this call (e.g. the command line's imports), continued here.
    """
    timings = timings or Timings()
    with timings.phase("checks"):
        plan = prepare(options)
    return execute(plan, callbacks, timings)


@dataclass
class _Records:
    """What a running search has recorded so far: the MLflow client, its parent run, whether its record is written."""

    mlflow: Any = None
    parent: str | None = None
    written: bool = False


def execute(plan: SearchPlan, callbacks: Sequence[Callback] = (), timings: Timings | None = None) -> SearchResult:
    """Run a prepared search: Ray, the predictors, the MLflow parent run, the Tuner, then results and trials.

    ``callbacks``: extra Ray Tune callbacks (e.g. the trial timeline of ``python -m benchmarks.trial``);
    ``timings``: where the seconds of each phase are added (the result's ``timings``).
    Ctrl-C or SIGTERM (``interrupts``) stops it as Tune's graceful stop does, closes its runs as KILLED and raises
    SearchInterrupted with the command that resumes it.
    """
    import ray

    started, timings = time.perf_counter() - (timings.total if timings else 0.0), timings or Timings()
    for note in plan.notes:
        log.info(f"note: {note}")
    records = _Records(written=plan.options.resume)
    with interrupts.handled():
        owns_ray = not ray.is_initialized()
        try:  # start or join Ray, check the trial request, measure, record, tune; Ray shut down after
            if owns_ray:
                from vitplast_tune.run import cluster

                with timings.phase("ray_start"):
                    cluster.init(plan.options.address, plan.options.connect_timeout_s)
            interrupts.on_sigterm_interrupt()  # after ray.init, which installs its own SIGTERM handler
            grid, predictors, view = _record_and_tune(plan, callbacks, records, timings)
        except KeyboardInterrupt:
            if records.parent is not None:
                tracking.close_search(records.mlflow, records.parent, "KILLED")
            raise _interrupted(plan, records, "stopped before its trials ended") from None
        except Exception as exc:
            if records.parent is not None:
                tracking.close_trials(records.mlflow, records.parent, "KILLED")
                tracking.mark_failed(records.mlflow, records.parent, exc)
            raise
        finally:
            if owns_ray:
                with timings.phase("ray_stop"):
                    ray.shutdown()
    mlflow, parent = records.mlflow, records.parent
    unfinished = tuner.unfinished(plan.location, plan.spec.total_trials)
    if unfinished:
        tracking.close_search(mlflow, parent, "KILLED")
        raise _interrupted(plan, records, f"{unfinished} trial(s) unfinished")
    with interrupts.deferred():  # every trial ended: record the results whole
        with timings.phase("results"):
            table = trials.trial_table(grid, plan.settings, predictors)
            result = SearchResult(
                plan.place, plan.spec, plan.settings, table, parent, view=view, notes=list(plan.notes)
            )
        return _finish(result, mlflow, grid, timings, started, plan.options)


def _finish(
    result: SearchResult, mlflow, grid, timings: Timings, started: float, options: SearchOptions
) -> SearchResult:
    """After the trials: the results recorded (MLflow, trial table, Optuna study), the analyses (with the plasticity
    ``options`` the search measured with), the parent run ended."""
    parent = result.parent_run_id
    try:
        with timings.phase("results"):
            _record_results(result, mlflow, grid)
            result.study = record_study(result, mlflow, grid)
        with timings.phase("analysis"):
            analyze(result, mlflow, options)
        result.elapsed_s, result.timings = time.perf_counter() - started, timings
        mlflow.log_dict(parent, timings.seconds, "timings.json")
    except Exception as exc:
        tracking.mark_failed(mlflow, parent, exc)
        raise
    mlflow.set_terminated(parent, status="FINISHED")
    return result


def _record_and_tune(plan: SearchPlan, callbacks: Sequence[Callback], records: _Records, timings: Timings):
    """Check the trial request on the cluster, measure the predictors, open the MLflow parent run and write the
    search's record (into ``records`` as they happen), then tune; return (Tune's result grid, predictors, view)."""
    with timings.phase("ray_start"):
        grows, staged = nodes.stage_inputs(plan)
    # The predictors, in one Ray worker with a trial's resources (a GPU when trials use GPUs); cached plasticity reused.
    predictors = measure.measure_predictors(plan, staged, timings)
    with timings.phase("records"):
        place = plan.place
        records.mlflow = tracking.client(plan.tracking_uri)
        records.parent = search_run.open_search_run(
            records.mlflow, place, plan.spec, plan.settings, predictors, seed=plan.seed, resume=plan.options.resume
        )
        view = search_run.publish_view(records.mlflow, place, records.parent, predictors.plasticity is not None)
        serves = f"; {command} serves it" if (command := ui_command(place)) else ""
        log.info(f"MLflow view (fills in as trials report{serves}): {view.link}")
        if plan.local_dir is not None:
            write_record(plan.local_dir, plan.record(records.parent))
        records.written = True
    with tuner.tune_environment(plan, grows), timings.phase("trials"):
        grid = _tune(plan, callbacks, records.parent, predictors, staged)
    return grid, predictors, view


def _interrupted(plan: SearchPlan, records: _Records, what: str) -> SearchInterrupted:
    """The SearchInterrupted of a search stopped by Ctrl-C or SIGTERM: how to resume it, or that nothing was recorded."""
    if records.written:
        text = f"{what}; nothing is lost: continue the search with {resume_command(plan)}"
    else:
        text = f"{what}, before anything was recorded: nothing to resume; run the same command again"
    return SearchInterrupted(text, interrupts.exit_code())


def _tune(plan: SearchPlan, callbacks: Sequence[Callback], parent: str, predictors: Predictors, staged=()):
    """Run the trials (the MLflow tracker, progress lines and ``callbacks`` attached); return Tune's result grid.
    ``staged``: the driver's files the trials read, sent to their nodes (``data.staging``)."""
    from ray import tune

    describe = trial_runs.trial_describer(plan.name, plan.settings, predictors)
    callbacks = [trial_runs.MlflowTracker(plan.tracking_uri, parent, describe), *callbacks]
    if plan.options.verbose:
        from vitplast_tune.run.progress import Progress

        callbacks.append(Progress(plan.spec.total_trials))
    trainable = tune.with_parameters(
        train_trial,
        settings=plan.settings,
        decoded=plan.decoded,
        max_trainable_params=plan.max_trainable_params,
        staged=list(staged),
    )
    trainable = tune.with_resources(trainable, parallel.trial_request(plan.options))  # several workers: a group
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


def analyze(result: SearchResult, mlflow, options: SearchOptions | None = None) -> None:
    """Every analysis the search supports (see ``analysis.analyze.analyze_search``), logged to the parent run;
    ``options``: the plasticity reference, variant and pairs to measure with (default: ``SearchOptions``')."""
    spec, found, o = result.spec, result.trials, options or SearchOptions()
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
    )
    search_run.log_analysis(mlflow, result.parent_run_id, result.analysis)


def record_study(result: SearchResult, mlflow, grid) -> study.StudyRecord | None:
    """The search's trials added to its Optuna study (``records.study``: ``optuna.db`` in its directory), whose
    storage the parent run's tag ``vitplast.optuna_study`` names."""
    if result.trials.empty:
        return None
    spec = result.spec
    metrics = [m for m, _ in spec.objectives] or [spec.metric]
    curves = trials.metric_curves(grid, metrics)
    found = study.write_study(result.place.results_dir, result.place.name, spec, result.trials, curves)
    mlflow.set_tag(result.parent_run_id, tracking.STUDY_TAG, f"{found.url} (study {found.name})")
    return found


def _record_results(result: SearchResult, mlflow, grid) -> None:
    """Each trial's run id and final metrics on its run; the trial table as CSV in the search's directory, the
    headline metrics on the parent run; the best trial's weights on its run and the parent's, its model on the
    parent's (``records.best_trial``)."""
    table = result.trials
    if not table.empty:
        table["run_id"] = table["trial_id"].map(tracking.trial_runs(mlflow, result.parent_run_id))
        trial_runs.log_trial_finals(mlflow, table)
    best = trials.top_trials(table, result.spec, 1)
    path = trials.write_trials(table, result.place.local_dir)
    if path is not None:
        search_run.log_results(mlflow, result.parent_run_id, path, best, len(table))
    search_run.log_pareto(
        mlflow, result.parent_run_id, pareto.write_pareto(table, result.place.results_dir / "analysis")
    )
    found = trials.trial_result(grid, best.iloc[0]["trial_id"]) if not best.empty else None
    if found is not None and found.checkpoint is not None:
        row = best.iloc[0].to_dict()
        uri, note = best_trial.log_best_trial(
            mlflow, result.settings, result.place.tracking_uri, result.parent_run_id, found, row
        )
        result.best_model_uri = uri
        result.best_run_id = row.get("run_id") if isinstance(row.get("run_id"), str) else None
        if note:
            log.info(f"note: {note}")


run_search = run  # the package's public name for it: vitplast_tune.run_search
