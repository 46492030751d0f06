"""The search's driver, top to bottom: validate -> start or join Ray -> measure the predictors -> record -> tune ->
results -> analyze. It never imports torch: trials and measurements run in Ray workers.

``run(options)`` is the whole job. Each step is one call into the module that owns it: ``plan``
(validation), ``cluster`` (Ray), ``predictors.report`` (plasticity, gradient table), ``tracking`` (MLflow),
``searchers`` (the Tuner), ``results`` (trial table, summary) and ``analysis.analyze`` (statistics, plots).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

from ray.tune import Callback

from vitplast_tune.analysis import protocol
from vitplast_tune.analysis.analyze import analyze_search
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import SearchInterrupted
from vitplast_tune.predictors.report import Predictors, gradient_report, search_report
from vitplast_tune.recommend import ranking, verify
from vitplast_tune.recommend.ranking import Recommendation
from vitplast_tune.search import results, searchers, spaces, tracking
from vitplast_tune.search.plan import SearchOptions, SearchPlan, prepare, write_record
from vitplast_tune.search.results import SearchResult
from vitplast_tune.search.trial import train_trial, trial_config
from vitplast_tune.storage import default_storage, read_record

__all__ = ["SearchOptions", "SearchResult", "run", "execute", "reanalyze", "compare_datasets", "verify_recommendation"]


def run(options: SearchOptions, callbacks: Sequence[Callback] = ()) -> SearchResult:
    """Validate the options into a plan, then run (or resume) the search and return its trials."""
    return execute(prepare(options), callbacks)


def execute(plan: SearchPlan, callbacks: Sequence[Callback] = ()) -> SearchResult:
    """Run a prepared search: Ray, the predictors, the MLflow parent run, the Tuner, then results and trials.

    ``callbacks``: extra Ray Tune callbacks (e.g. the trial timeline of ``python -m benchmarks.trial``).
    """
    import ray

    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    started = time.perf_counter()
    for note in plan.notes:
        _say(plan, f"note: {note}")
    owns_ray = not ray.is_initialized()
    if owns_ray:
        from vitplast_tune.search import cluster

        cluster.init(plan.options.address)
    mlflow, parent = None, None
    try:  # join and check the trial request, measure, then record; Ray shut down after; a failure marks the run
        grows = _check_cluster(plan)
        # The predictors, as a Ray task with a trial's resources (a GPU when trials use GPUs); cached plasticity reused.
        predictors = measure_predictors(plan)
        mlflow = tracking.client(plan.tracking_uri)
        parent = tracking.open_search_run(mlflow, plan, predictors)
        view = tracking.publish_view(mlflow, plan, parent, predictors.plasticity is not None)
        write_record(plan, parent)
        with searchers.pending_limit(plan, grows):
            grid = _tune(plan, callbacks, parent, predictors)
    except KeyboardInterrupt:
        if parent is not None:
            mlflow.set_terminated(parent, status="KILLED")
        raise
    except Exception as exc:
        if parent is not None:
            tracking.mark_failed(mlflow, parent, exc)
        raise
    finally:
        if owns_ray:
            ray.shutdown()
    unfinished = searchers.unfinished(grid, plan.spec.total_trials)
    if unfinished:
        mlflow.set_terminated(parent, status="KILLED")
        raise SearchInterrupted(
            f"{unfinished} trial(s) unfinished; nothing is lost: continue the search with {resume_command(plan)}"
        )
    result = SearchResult(
        plan, results.trial_table(grid, plan, predictors), parent, time.perf_counter() - started, view=view
    )
    try:
        _record_results(result, mlflow, grid)
        analyze(result, mlflow)
    except Exception as exc:
        tracking.mark_failed(mlflow, parent, exc)
        raise
    mlflow.set_terminated(parent, status="FINISHED")
    return result


def _tune(plan: SearchPlan, callbacks: Sequence[Callback], parent: str, predictors: Predictors):
    """Run the trials (the MLflow tracker, progress lines and ``callbacks`` attached); return Tune's result grid."""
    from ray import tune

    callbacks = [
        tracking.MlflowTracker(plan.tracking_uri, parent, tracking.trial_describer(plan, predictors)),
        *callbacks,
    ]
    if plan.options.verbose:
        from vitplast_tune.search.progress import Progress

        callbacks.append(Progress(plan.spec.total_trials))
    trainable = tune.with_parameters(
        train_trial, settings=plan.settings, decoded=plan.decoded, max_trainable_params=plan.max_trainable_params
    )
    trainable = tune.with_resources(trainable, plan.options.trial_resources)
    return searchers.tuner(plan, trainable, callbacks, ranking.warm_start_subsets(plan, predictors)).fit()


def resume_command(plan: SearchPlan) -> str:
    """The command that continues an interrupted search: its space file, name and storage."""
    words = ["vitplast-search", "--space", str(plan.spec.path), "--name", plan.name, "--storage", plan.storage]
    return shlex.join([*words, "--resume"])


def _say(plan: SearchPlan, text: str) -> None:
    if plan.options.verbose:
        print(text, flush=True)


def analyze(result: SearchResult, mlflow) -> None:
    """Every analysis the search supports (see ``analysis.analyze.analyze_search``), logged to the parent run."""
    plan = result.plan
    result.analysis = analyze_search(
        result.trials,
        plan.spec,
        plan.settings,
        plan.results_dir / "analysis",
        reference=plan.options.plasticity_reference,
        plasticity_pairs=plan.options.plasticity_pairs,
        variant=plan.options.plasticity_variant,
    )
    tracking.log_analysis(mlflow, result.parent_run_id, result.analysis)


def reanalyze(
    name: str, storage: str | None = None, tracking_uri: str | None = None, criteria: bool = False
) -> SearchResult:
    """Analyze a finished search again from its stored trial table and log to its parent run (``criteria``: also the lab)."""
    directory = Path(storage or default_storage()).expanduser() / name
    record, trials = read_record(directory), results.read_trials(directory)
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
    headline metrics and the best trial's trained weights on the parent run."""
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
        cfg = trial_config(found.config or {}, result.plan.settings)
        tracking.log_best_weights(mlflow, result.parent_run_id, found.checkpoint, best.iloc[0].to_dict(), cfg)


def _check_cluster(plan: SearchPlan) -> bool:
    """UserError when no node (or node type) of the cluster can ever hold one trial (see cluster.py); else
    whether the cluster can grow (an autoscaler adds nodes for pending trials)."""
    from vitplast_tune.search import cluster

    how = cluster.preflight(
        plan.options.trial_resources, plan.storage, say=print if plan.options.verbose else lambda *a: None
    )
    return how != "node" or (not cluster.started_here() and cluster.autoscales() is not False)


def measure_predictors(plan: SearchPlan) -> Predictors:
    """The predictors a search measures before training (plasticity, gradient table), each as a Ray task with one
    trial's resources; plasticity measured before is read from its cache instead."""
    if not plan.options.plasticity:
        return Predictors()
    from vitplast_tune.search.cluster import task_runner

    s, o = plan.settings, plan.options
    say = print if o.verbose else lambda *a, **k: None
    run = task_runner(o.trial_resources, say)
    say(
        f"Plasticity of {s.model} ({o.plasticity_variant} variant): {s.dataset} test split vs {o.plasticity_reference} ...",
        flush=True,
    )
    measured = search_report(
        s, reference=o.plasticity_reference, variant=o.plasticity_variant, max_pairs=o.plasticity_pairs, runner=run
    )
    ranked = measured.ranking.dropna(subset=["rank"]).sort_values("rank")
    order = " > ".join(f"{r.component} {r.plasticity:.3g}" for r in ranked.itertuples())
    say(
        f"  ranking: {order}  ({'cached' if measured.meta.get('reused') else 'measured'}, {measured.out_dir})",
        flush=True,
    )
    gradients = gradient_report(s, decoded=plan.decoded, runner=run)
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
