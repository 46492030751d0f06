"""The search's driver, top to bottom: validate -> start or join Ray -> measure the predictors -> record -> tune ->
results -> analyze. It never imports torch: trials and measurements run in Ray workers.

``run(options)`` is the whole job. Each step is one call into the module that owns it: ``plan``
(validation), ``cluster`` (Ray), ``predictors.report`` (plasticity, gradient table), ``tracking`` (MLflow),
``searchers`` (the Tuner), ``results`` (trial table, summary) and ``analysis.analyze`` (statistics, plots).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.tune import Callback

from vitplast_tune.analysis import protocol
from vitplast_tune.analysis.analyze import analyze_search
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data import staging
from vitplast_tune.errors import SearchInterrupted
from vitplast_tune.predictors.report import Predictors, describe_gradients, gradient_report, search_report
from vitplast_tune.recommend import ranking, verify
from vitplast_tune.recommend.ranking import Recommendation
from vitplast_tune.search import interrupts, parallel, results, searchers, spaces, study, tracking
from vitplast_tune.search.plan import EXPERIMENT, SearchOptions, SearchPlan, prepare, write_record
from vitplast_tune.search.results import SearchResult
from vitplast_tune.search.timings import Timings
from vitplast_tune.search.trial import train_trial
from vitplast_tune.storage import default_storage, read_record

__all__ = ["SearchOptions", "SearchResult", "run", "execute", "reanalyze", "compare_datasets", "verify_recommendation"]


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
        _say(plan, f"note: {note}")
    records = _Records(written=plan.options.resume)
    with interrupts.handled():
        owns_ray = not ray.is_initialized()
        try:  # start or join Ray, check the trial request, measure, record, tune; Ray shut down after
            if owns_ray:
                from vitplast_tune.search import cluster

                with timings.phase("ray_start"):
                    cluster.init(plan.options.address, plan.options.connect_timeout_s, say=lambda t: _say(plan, t))
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
    unfinished = searchers.unfinished(plan.location, plan.spec.total_trials)
    if unfinished:
        tracking.close_search(mlflow, parent, "KILLED")
        raise _interrupted(plan, records, f"{unfinished} trial(s) unfinished")
    with timings.phase("results"):
        result = SearchResult(plan, results.trial_table(grid, plan, predictors), parent, 0.0, view=view)
    return _finish(result, mlflow, grid, timings, started)


def _finish(result: SearchResult, mlflow, grid, timings: Timings, started: float) -> SearchResult:
    """After the trials: the results recorded (MLflow, trial table, Optuna study), the analyses, the parent run ended."""
    parent = result.parent_run_id
    try:
        with timings.phase("results"):
            _record_results(result, mlflow, grid)
            result.study = record_study(result, mlflow, grid)
        with timings.phase("analysis"):
            analyze(result, mlflow)
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
        grows, staged = _check_cluster(plan)
    # The predictors, in one Ray worker with a trial's resources (a GPU when trials use GPUs); cached plasticity reused.
    predictors = measure_predictors(plan, staged, timings)
    with timings.phase("records"):
        records.mlflow = tracking.client(plan.tracking_uri)
        records.parent = tracking.open_search_run(records.mlflow, plan, predictors)
        view = tracking.publish_view(records.mlflow, plan, records.parent, predictors.plasticity is not None)
        serves = f"; {command} serves it" if (command := results.ui_command(plan)) else ""
        _say(plan, f"MLflow view (fills in as trials report{serves}): {view.link}")
        write_record(plan, records.parent)
        records.written = True
    with searchers.tune_environment(plan, grows), timings.phase("trials"):
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

    callbacks = [
        tracking.MlflowTracker(plan.tracking_uri, parent, tracking.trial_describer(plan, predictors)),
        *callbacks,
    ]
    if plan.options.verbose:
        from vitplast_tune.search.progress import Progress

        callbacks.append(Progress(plan.spec.total_trials))
    trainable = tune.with_parameters(
        train_trial,
        settings=plan.settings,
        decoded=plan.decoded,
        max_trainable_params=plan.max_trainable_params,
        staged=list(staged),
    )
    trainable = tune.with_resources(trainable, parallel.trial_request(plan.options))  # several workers: a group
    tuner = searchers.tuner(plan, trainable, callbacks, ranking.warm_start_subsets(plan, predictors))
    try:
        return tuner.fit()
    finally:
        interrupts.restore_ctrl_c()  # Tune leaves its SIGINT handler, which nothing reads once fit returns


def resume_command(plan: SearchPlan) -> str:
    """The command that continues an interrupted search: its space file, name and storage, and the flags it ran with
    that its record does not hold (resources per trial, plasticity, the cluster)."""
    o, default = plan.options, SearchOptions()
    path = Path(plan.spec.path).resolve()
    space = path.stem if path.parent == spaces.spaces_dir().resolve() else str(path)  # a shipped space by its name
    words = ["vitplast-search", "--space", space, "--name", plan.name, "--storage", plan.storage]
    flags = {
        "--cpus-per-trial": (o.cpus_per_trial, default.cpus_per_trial),
        "--gpus-per-trial": (o.gpus_per_trial, default.gpus_per_trial),
        "--workers-per-trial": (o.workers_per_trial, default.workers_per_trial),
        "--address": (o.address, default.address),
        "--connect-timeout": (o.connect_timeout_s, default.connect_timeout_s),
    }
    if o.resources_per_trial:
        flags["--resources-per-trial"] = (json.dumps(o.resources_per_trial), None)
    if o.plasticity:
        flags["--plasticity-variant"] = (o.plasticity_variant, default.plasticity_variant)
        flags["--plasticity-reference"] = (o.plasticity_reference, default.plasticity_reference)
        flags["--plasticity-pairs"] = (o.plasticity_pairs, default.plasticity_pairs)
    else:
        words.append("--no-plasticity")
    for flag, (value, usual) in flags.items():
        if value != usual:
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join([*words, "--resume"])


def _say(plan: SearchPlan, text: str) -> None:
    if plan.options.verbose:
        print(text, flush=True)


def analyze(result: SearchResult, mlflow) -> None:
    """Every analysis the search supports (see ``analysis.analyze.analyze_search``), logged to the parent run."""
    plan, trials = result.plan, result.trials
    parameters = None if trials.empty else (study.parameter_table(trials, plan.spec), study.study_parameters(plan.spec))
    result.analysis = analyze_search(
        trials,
        plan.spec,
        plan.settings,
        plan.results_dir / "analysis",
        reference=plan.options.plasticity_reference,
        plasticity_pairs=plan.options.plasticity_pairs,
        parameters=parameters,
        variant=plan.options.plasticity_variant,
    )
    tracking.log_analysis(mlflow, result.parent_run_id, result.analysis)


def record_study(result: SearchResult, mlflow, grid) -> study.StudyRecord | None:
    """The search's trials added to its Optuna study (``search.study``: ``optuna.db`` in its directory), whose
    storage the parent run's tag ``vitplast.optuna_study`` names."""
    plan = result.plan
    if result.trials.empty:
        return None
    metrics = [m for m, _ in plan.spec.objectives] or [plan.spec.metric]
    curves = results.metric_curves(grid, metrics)
    found = study.write_study(plan.results_dir, plan.name, plan.spec, result.trials, curves)
    mlflow.set_tag(result.parent_run_id, tracking.STUDY_TAG, f"{found.url} (study {found.name})")
    return found


def reanalyze(
    name: str, storage: str | None = None, tracking_uri: str | None = None, criteria: bool = False
) -> SearchResult:
    """Analyze a finished search again from its stored trial table and log to its parent run (``criteria``: also the lab)."""
    directory = Path(storage or default_storage()).expanduser() / name
    record, trials = read_record(directory, purpose="recorded"), results.read_trials(directory)
    spec = spaces.load_space(record["space_path"])
    spec = dataclasses.replace(spec, criteria=spec.criteria or criteria)
    options = SearchOptions(space=record["space_path"], name=name, storage=str(directory.parent))
    plan = SearchPlan(
        spec,
        options,
        name,
        str(directory.parent),
        tracking_uri or record["tracking_uri"],
        FinetuneConfig.from_dict(record["settings"]),
        experiment=record.get("experiment", EXPERIMENT),
    )
    result = SearchResult(plan, trials, record["parent_run_id"], 0.0)
    analyze(result, tracking.client(plan.tracking_uri))
    return result


def compare_datasets(names: Sequence[str], storage: str | None = None, out_dir: str | None = None) -> str:
    """The paper's cross-dataset table of several finished searches (one per dataset), written to ``out_dir``; as text."""
    root = Path(storage or default_storage()).expanduser()
    trials = {name: results.read_trials(root / name) for name in names}
    out = Path(out_dir).expanduser() if out_dir else root / f"cross-{'-'.join(names)}"
    gains, agreement, _ = protocol.cross_dataset_report(trials, out)
    return protocol.describe_cross_dataset(gains, agreement) + f"\nfiles: {out}"


def _record_results(result: SearchResult, mlflow, grid) -> None:
    """Each trial's run id and final metrics on its run; the trial table as CSV in the search's directory, the
    headline metrics on the parent run; the best trial's weights on its run and the parent's, its model on the
    parent's (``tracking.log_best_trial``)."""
    trials = result.trials
    if not trials.empty:
        trials["run_id"] = trials["trial_id"].map(tracking.trial_runs(mlflow, result.parent_run_id))
        tracking.log_trial_finals(mlflow, trials)
    best = results.top_trials(result, 1)
    path = results.write_trials(result)
    if path is not None:
        tracking.log_results(mlflow, result.parent_run_id, path, best, len(trials))
    tracking.log_pareto(mlflow, result.parent_run_id, results.write_pareto(result))
    found = results.trial_result(grid, best.iloc[0]["trial_id"]) if not best.empty else None
    if found is not None and found.checkpoint is not None:
        row = best.iloc[0].to_dict()
        result.best_model_uri, note = tracking.log_best_trial(mlflow, result.plan, result.parent_run_id, found, row)
        result.best_run_id = row.get("run_id") if isinstance(row.get("run_id"), str) else None
        if note:
            _say(result.plan, f"note: {note}")


def _check_cluster(plan: SearchPlan) -> tuple[bool, list[staging.Staged]]:
    """UserError when no node (or node type) of the cluster can ever hold one trial, or when a local storage path is
    not shared by the nodes (see cluster.py); else whether the cluster can grow (an autoscaler adds nodes for
    pending trials), and the files of the driver's disk sent to the nodes that lack them (``data.staging``)."""
    from vitplast_tune.search import cluster

    say = print if plan.options.verbose else lambda *a, **k: None
    options = plan.options
    inputs = staging.needed(plan.settings, options.plasticity_reference if options.plasticity else None)
    checked = cluster.preflight(options.trial_resources, plan.storage, inputs, say=say)
    for files in checked.to_stage:
        say(f"Sending the {files.describe()} to the nodes through Ray's object store", flush=True)
    return checked.grows, staging.stage(checked.to_stage)


def measure_predictors(
    plan: SearchPlan, staged: Sequence[staging.Staged] = (), timings: Timings | None = None
) -> Predictors:
    """The predictors a search measures before training (plasticity, gradient table), in one Ray worker with a
    trial's resources (``cluster.measuring_worker``), on the dataset the driver decoded and the files it staged;
    plasticity measured before is read from its cache instead (``timings``: their seconds)."""
    if not plan.options.plasticity:
        return Predictors()
    timings = timings or Timings()
    from vitplast_tune.search.cluster import measuring_worker

    s, o = plan.settings, plan.options
    say = print if o.verbose else lambda *a, **k: None
    with measuring_worker(o.trial_resources, say) as run:  # one worker, one import of torch, for both
        say(
            f"Plasticity of {s.model} ({o.plasticity_variant} variant): {s.dataset} test split vs {o.plasticity_reference} ...",
            flush=True,
        )
        with timings.phase("plasticity"):
            measured = search_report(
                s,
                reference=o.plasticity_reference,
                variant=o.plasticity_variant,
                max_pairs=o.plasticity_pairs,
                runner=run,
                decoded=plan.decoded,
                staged=list(staged),
            )
        ranked = measured.ranking.dropna(subset=["rank"]).sort_values("rank")
        order = " > ".join(f"{r.component} {r.plasticity:.3g}" for r in ranked.itertuples())
        say(
            f"  ranking: {order}  ({'cached' if measured.meta.get('reused') else 'measured'}, {measured.out_dir})",
            flush=True,
        )
        with timings.phase("gradients"):
            gradients = gradient_report(s, decoded=plan.decoded, runner=run, staged=list(staged))
        say(
            f"Gradient criteria of {s.model} on {gradients.attrs.get('num_batches')} unaugmented training batches, "
            f"mean ± std over {gradients['head_seed'].nunique()} head initialisations:\n"
            + describe_gradients(gradients),
            flush=True,
        )
    return Predictors(measured, gradients)


def verify_recommendation(
    rec: Recommendation,
    k: int,
    storage: Path,
    *,
    name: str | None = None,
    lrs=verify.VERIFY_LRS,
    max_steps: int | None = None,
    cpus_per_trial: float = 1.0,
    verbose: int = 0,
):
    """Check a recommendation with a short search: the grid of ``recommend.verify.verify_space`` run under ``storage``;
    return ``verification``'s table and the search's ``SearchResult``."""
    name = name or f"recommend-verify-{time.strftime('%Y%m%d-%H%M%S')}"
    space = verify.verify_space(rec, k, Path(storage).expanduser() / "recommend", lrs=lrs, max_steps=max_steps)
    options = SearchOptions(
        space=str(space),
        name=name,
        storage=str(storage),
        cpus_per_trial=cpus_per_trial,
        verbose=verbose,
        settings={"seed": rec.settings.seed},
    )
    result = run(options)
    return verify.verification(rec, result.trials, k), result
