"""Open a search's MLflow parent run, and log its view, results and analysis on it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from mlflow.entities import RunTag
from mlflow.tracking import MlflowClient

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.predictors import report
from vitplast_tune.predictors.scores import criteria_summary, gradient_criteria
from vitplast_tune.records import view as saved_view
from vitplast_tune.records.cost import cost_points
from vitplast_tune.records.table import read_trials
from vitplast_tune.records.tracking import (
    BEST_TAG,
    BEST_WEIGHTS,
    NOTE_TAG,
    ROLE_TAG,
    SEARCH_ID_TAG,
    STORAGE_TAG,
    VIEW_LINK_TAG,
    artifact_location,
    find_search_run,
    log_artifacts,
    log_metrics,
    log_table_once,
    start_ms,
    start_search_run,
)
from vitplast_tune.space.files import SearchSpec, searched_augmentations
from vitplast_tune.space.objectives import objective_of
from vitplast_tune.storage import BEST_TRIAL_DIR, MODEL_NAME, TRIAL_FILE, SearchPlace


def open_search_run(
    mlflow: MlflowClient,
    place: SearchPlace,
    spec: SearchSpec,
    settings: FinetuneConfig,
    predictors: report.Predictors,
    *,
    seed: int,
    resume: bool = False,
) -> str:
    """Find the parent run again when ``resume``, else create it with the space, settings and plasticity; return its id."""
    if resume:
        existing = find_search_run(
            mlflow,
            place.experiment,
            place.name,
            search_id=place.search_id or None,
            storage=None if place.search_id else place.location,
        )
        if existing:
            mlflow.update_run(existing, status="RUNNING")
            return existing
    params = {
        "space": spec.name,
        "algorithm": spec.algorithm,
        **({"sampler": spec.sampler} if spec.algorithm == "optuna" else {}),
        "scheduler": spec.scheduler.name,
        "num_samples": spec.num_samples,
        "metric": spec.metric,
        "mode": spec.mode,
        "augment": augmentation_text(spec, settings).removeprefix("augmentation "),
        "objective": objective_of(spec),
        "search_seed": seed,
        **{f"default.{k}": v for k, v in settings.to_dict().items()},
    }
    tags = {
        "vitplast.space_fingerprint": spec.fingerprint,
        STORAGE_TAG: place.location,
        SEARCH_ID_TAG: place.search_id,
        NOTE_TAG: _note(place.name),
    }
    plasticity = predictors.plasticity
    if plasticity is not None:
        meta = plasticity.meta
        params.update(
            plasticity_variant=meta["variant"], plasticity_reference=meta["reference"], plasticity_pairs=meta["n_pairs"]
        )
    artifacts = artifact_location(place.tracking_uri, place.experiment, place.storage)
    run_id = start_search_run(mlflow, place.experiment, place.name, params, tags, artifacts)
    mlflow.log_text(run_id, spec.text, f"space/{spec.path.name}")
    if predictors.gradients is not None:
        layers = gradient_criteria(predictors.gradients)  # each layer's sums and criteria
        mlflow.log_text(run_id, layers.to_csv(index=False), "criteria/gradients.csv")
        summary = criteria_summary(predictors.gradients)
        mlflow.log_text(run_id, summary.to_csv(index=False), "criteria/gradients_summary.csv")
    if plasticity is not None:
        log_artifacts(mlflow, run_id, plasticity.files.values(), "plasticity")
        mlflow.log_table(run_id, plasticity.ranking, "plasticity/ranking.json")
    return run_id


def _note(search: str, link: str | None = None, note: str = "") -> str:
    """Write the parent run's description in Markdown: what the runs and metrics are, and the view's link."""
    lines = [
        f"**Search `{search}`**: one child run per trial (tag `{ROLE_TAG}` = `trial`); this run (`search`) holds "
        "the search-wide settings (params `default.*`), the plasticity table and the analysis."
    ]
    if link:
        lines += ["", f"[Open the trials view]({link}) (trials sorted by accuracy at the common step, with charts)."]
    if note:
        lines += ["", note]
    lines += [
        "",
        "Metrics: `best_val_acc` (best validation accuracy of the best trial), `best_test_acc` (test accuracy "
        "of that trial's best-validation weights), `num_trials`. Trials: `val_acc_common` is the validation "
        "accuracy at `common_step`, the last evaluation every trial reached (the fair comparison under early "
        "stopping); `plasticity_mean` is the subset's mean plasticity; `trainable_params` and its log10.",
        "",
        "Artifacts: `analysis/correlations.json` (Spearman and Kendall of plasticity and of log trainable "
        "parameters with accuracy, bootstrap 95% intervals), plots, `trials.csv`, "
        f"`{BEST_WEIGHTS}` (the best trial's trained parameters, beside its settings in "
        f"`{BEST_TRIAL_DIR}/{TRIAL_FILE}`; its own run is tagged `{BEST_TAG}` = `true`).",
        "",
        f'The best model: `mlflow.pytorch.load_model("runs:/<this run\'s id>/{MODEL_NAME}")`, or '
        f'`vitplast_tune.load_best_model("{search}", storage=...)`.',
    ]
    return "\n".join(lines)


def publish_view(
    mlflow: MlflowClient, place: SearchPlace, run_id: str, plasticity: bool, cost: bool = False
) -> saved_view.View:
    """Save the search's MLflow UI view and put its link on the parent run; ``cost`` adds the cost charts."""
    experiment = mlflow.get_run(run_id).info.experiment_id
    base_url = saved_view.ui_base_url(place.tracking_uri)
    view = saved_view.publish(mlflow, experiment, place.name, plasticity, base_url, cost)
    tags = {VIEW_LINK_TAG: view.link, NOTE_TAG: _note(place.name, view.link, view.note)}
    mlflow.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    return view


def log_results(mlflow: MlflowClient, run_id: str, trials_csv: Path, best: pd.DataFrame, num_trials: int) -> None:
    """Log the trial table, as CSV and as ``trials.json``, and the headline metrics on the parent run, once."""
    log_artifacts(mlflow, run_id, [trials_csv])
    log_table_once(mlflow, run_id, read_trials(trials_csv.parent), "trials.json")
    if not best.empty:
        top = best.iloc[0]
        headline = {"best_val_acc": top["best_val_acc"], "best_test_acc": top.get("test_acc"), "num_trials": num_trials}
        log_metrics(mlflow, run_id, headline, timestamp_ms=start_ms(mlflow, run_id))


def log_analysis(mlflow: MlflowClient, run_id: str, found, once: bool = False) -> None:
    """Log a ``SearchAnalysis``'s tables and files on the parent run; ``once`` skips a table the run holds."""
    tables = {
        "analysis/correlations.json": found.trials.correlations if found.trials is not None else None,
        "analysis/paper_table.json": found.paper.table if found.paper is not None else None,
        "analysis/criteria.json": found.criteria,
        "analysis/importance.json": found.importance.table
        if found.importance is not None and not found.importance.table.empty
        else None,
        "analysis/depth_table.json": found.depth.table if found.depth is not None else None,
    }
    for path, table in tables.items():
        if table is not None and once:
            log_table_once(mlflow, run_id, table, path)
        elif table is not None:
            mlflow.log_table(run_id, table, path)
    log_artifacts(mlflow, run_id, found.files, "analysis")


def log_cost(mlflow: MlflowClient, run_id: str, trials: pd.DataFrame, objective: str) -> None:
    """Log a cost-aware objective's points on the parent run: the numbers and the sentences."""
    points = cost_points(trials, objective)
    if not points:
        return
    mlflow.log_dict(run_id, {"objective": objective, "points": [vars(p) for p in points]}, "cost/points.json")
    mlflow.log_text(run_id, "\n".join(p.sentence() for p in points) + "\n", "cost/answer.txt")


def augmentation_text(spec: SearchSpec, settings: FinetuneConfig) -> str:
    """Say which training augmentation the trials used: the settings' recipe, or the recipes the space searches."""
    searched = searched_augmentations(spec)
    if len(set(searched)) > 1:
        return f"augmentation searched: {', '.join(map(str, dict.fromkeys(searched)))}"
    return f"augmentation {searched[0] if searched else settings.augment}"
