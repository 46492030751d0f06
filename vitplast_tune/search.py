"""Running (or resuming) a search, top to bottom: validate -> measure -> start or join Ray -> tune ->
results -> analyse.

``run(options)`` is the whole job. Each step is one call into the module that owns it: ``plan``
(validation), ``report`` (plasticity), ``cluster`` (Ray), ``tracking`` (MLflow), ``searchers``
(the Tuner), ``results`` (trial table, summary) and ``analysis`` (statistics, plots).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

import pandas as pd
from ray.tune import Callback

from vitplast_tune import analysis, report, results, searchers, spaces, tracking
from vitplast_tune.errors import SearchInterrupted, UserError
from vitplast_tune.plan import SearchOptions, SearchPlan, default_storage, prepare, read_record, write_record
from vitplast_tune.results import SearchResult
from vitplast_tune.trial import train_trial

__all__ = ["SearchOptions", "SearchResult", "run", "execute", "reanalyse", "measure_plasticity"]


def run(options: SearchOptions, callbacks: Sequence[Callback] = ()) -> SearchResult:
    """Validate the options into a plan, then run (or resume) the search and return its trials."""
    return execute(prepare(options), callbacks)


def execute(plan: SearchPlan, callbacks: Sequence[Callback] = ()) -> SearchResult:
    """Run a prepared search: plasticity, Ray, MLflow parent run, the Tuner, then results and analysis.

    ``callbacks``: extra Ray Tune callbacks (e.g. the trial timeline of scripts/bench_trial.py).
    """
    import ray

    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    started = time.perf_counter()
    for note in plan.notes:
        _say(plan, f"note: {note}")
    plasticity = measure_plasticity(plan)  # on the driver, before Ray: it also proves the weights load
    owns_ray = not ray.is_initialized()
    if owns_ray:
        _init_ray(plan.options.address)
    mlflow, parent = None, None
    try:  # cluster: join and check the per-trial request before any record exists; Ray shut down after
        _check_cluster(plan)
        mlflow = tracking.client(plan.tracking_uri)
        parent = tracking.open_search_run(mlflow, plan, plasticity)
        write_record(plan, parent)
        grid, trials = _tune(plan, callbacks, mlflow, parent, plasticity)
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
    unfinished = max(plan.spec.total_trials - grid.num_terminated - grid.num_errors, 0)  # Tune stops early on Ctrl-C
    if unfinished:
        mlflow.set_terminated(parent, status="KILLED")
        raise SearchInterrupted(
            f"{unfinished} trial(s) unfinished; nothing is lost: continue the search with "
            f"python scripts/search.py --name {plan.name} --storage {plan.storage} --resume"
        )
    result = SearchResult(plan, trials, parent, time.perf_counter() - started)
    try:
        _record_results(result, mlflow)
        if plasticity is not None:
            result.correlations = analyse(result, mlflow)
    except Exception as exc:
        tracking.mark_failed(mlflow, parent, exc)
        raise
    mlflow.set_terminated(parent, status="FINISHED")
    return result


def _tune(plan: SearchPlan, callbacks: Sequence[Callback], mlflow, parent: str, plasticity) -> tuple:
    """Run the trials (the MLflow tracker, progress lines and ``callbacks`` attached); return the grid and trial table."""
    from ray import tune

    callbacks = [tracking.MlflowTracker(plan.tracking_uri, parent, tracking.trial_describer(plan, plasticity)), *callbacks]
    if plan.options.verbose:
        from vitplast_tune.progress import Progress

        callbacks.append(Progress(plan.spec.total_trials))
    trainable = tune.with_parameters(train_trial, settings=plan.settings, decoded=plan.decoded)
    trainable = tune.with_resources(trainable, plan.options.trial_resources)
    grid = searchers.tuner(plan, trainable, callbacks).fit()
    return grid, results.trial_table(grid, plan, plasticity)


def _say(plan: SearchPlan, text: str) -> None:
    if plan.options.verbose:
        print(text, flush=True)


def measure_plasticity(plan: SearchPlan) -> report.PlasticityReport | None:
    """The plasticity report of the search's model and data, from the cache when it was measured before."""
    if not plan.options.plasticity:
        return None
    s, o = plan.settings, plan.options
    say = print if o.verbose else lambda *a, **k: None
    say(f"Plasticity of {s['model']} ({o.plasticity_variant} variant): {s['dataset']} test split vs {o.plasticity_reference} ...", flush=True)
    measured = report.plasticity_report(
        s["model"], weights=s["weights"], pretrained=s["pretrained"], dataset=s["dataset"],
        reference=o.plasticity_reference, data_dir=s["data_dir"], download=s["download"],
        variant=o.plasticity_variant, max_pairs=o.plasticity_pairs, reuse=True,
    )  # fmt: skip
    ranking = measured.ranking.dropna(subset=["rank"]).sort_values("rank")
    order = " > ".join(f"{r.component} {r.plasticity:.3g}" for r in ranking.itertuples())
    say(f"  ranking: {order}  ({'cached' if measured.meta.get('reused') else 'measured'}, {measured.out_dir})", flush=True)
    return measured


def analyse(result: SearchResult, mlflow) -> pd.DataFrame:
    """Plasticity vs final accuracy over the finished trials: statistics and plots, logged to the parent run."""
    found = analysis.analyse_trials(result.trials, result.plan.results_dir / "analysis")
    tracking.log_analysis(mlflow, result.parent_run_id, found)
    return found.correlations


def reanalyse(name: str, storage: str | None = None, tracking_uri: str | None = None) -> SearchResult:
    """Analyse a finished search again from its stored trial table and log to its parent run."""
    directory = Path(storage or default_storage()).expanduser() / name
    record, trials_path = read_record(directory), directory / "trials.csv"
    if not trials_path.is_file():
        raise UserError(f'search "{name}" in {directory.parent} has not finished: no trial table to analyse')
    options = SearchOptions(space=record["space_path"], name=name, storage=str(directory.parent))
    plan = SearchPlan(spaces.load_space(record["space_path"]), options, name, str(directory.parent),
                      tracking_uri or record["tracking_uri"], record["settings"])  # fmt: skip
    result = SearchResult(plan, pd.read_csv(trials_path, dtype={"trial_id": str}), record["parent_run_id"], 0.0)
    result.correlations = analyse(result, tracking.client(plan.tracking_uri))
    return result


def _record_results(result: SearchResult, mlflow) -> None:
    """The trial table as CSV in the search's directory, and the headline metrics, on the parent run."""
    path = results.write_trials(result)
    if path is not None:
        tracking.log_results(mlflow, result.parent_run_id, path, results.top_trials(result, 1), len(result.trials))


def _init_ray(address: str | None) -> None:
    import ray

    from vitplast_tune import cluster

    address = cluster.address(address)  # --address, else RAY_ADDRESS
    runtime_env = {"env_vars": {"PYTHONWARNINGS": "ignore::DeprecationWarning"}}
    if address:
        cluster.connect(address, runtime_env=runtime_env, log_to_driver=False)  # UserError when refused/unreachable
    else:
        ray.init(include_dashboard=False, runtime_env=runtime_env, log_to_driver=False, configure_logging=False)


def _check_cluster(plan: SearchPlan) -> None:
    """UserError when no node (or node type) of the cluster can ever hold one trial; see cluster.py."""
    from vitplast_tune import cluster

    cluster.preflight(plan.options.trial_resources, plan.storage, say=print if plan.options.verbose else lambda *a: None)
