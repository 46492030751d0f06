"""The results of a search: one row per trial, the best trials, the Pareto fronts (accuracy against trainable
parameters and against training throughput), and the summary a person reads at the end.

``trial_table`` reads Tune's result grid (duck-typed: each result's config, metrics, error and
metrics dataframe), so this module needs no Ray; ``summary`` renders a ``SearchResult`` as text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from vitplast_tune.analysis.analyze import SearchAnalysis
from vitplast_tune.components import method_label, subset_name
from vitplast_tune.predictors import report
from vitplast_tune.search import distributions
from vitplast_tune.search.mlflow_view import View, run_link, ui_base_url
from vitplast_tune.search.plan import SearchPlan, searched_augmentations
from vitplast_tune.search.study import StudyRecord
from vitplast_tune.search.timings import Timings
from vitplast_tune.search.trial import trial_config, trial_subset
from vitplast_tune.storage import default_storage


@dataclass
class SearchResult:
    """The finished search: its trials (one row each) and where everything lies."""

    plan: SearchPlan
    trials: pd.DataFrame
    parent_run_id: str
    elapsed_s: float
    analysis: SearchAnalysis | None = None
    view: View | None = None  # the search's MLflow UI view and its link
    timings: Timings | None = None  # seconds per phase (timings.py)
    study: StudyRecord | None = None  # the search's Optuna study (study.py)
    best_model_uri: str | None = None  # runs:/<parent>/best_model: the best trial's model (mlflow.pytorch.load_model)
    best_run_id: str | None = None  # the best trial's MLflow run (tagged vitplast.best)


# Where a trial's time went (training.finetune's cumulative timing metrics at its last report).
TRIAL_TIMES = ("time_setup_s", "time_in_steps_s", "time_in_eval_s")


def trial_table(grid, plan: SearchPlan, predictors: report.Predictors | None = None) -> pd.DataFrame:
    """One row per trial: its subset, parameters, final and best metrics, status and pre-training predictors.

    ``val_acc_common`` is each trial's validation accuracy at ``common_step``, the last evaluation
    every trial reached: with early stopping, the one budget all trials share. ``best_val_loss`` is
    the lowest validation loss it reported (a tie-break between equal accuracies).
    """
    rows, curves = [], []
    for result in grid:
        config, metrics = result.config or {}, result.metrics or {}
        cfg = trial_config(config, plan.settings)
        subset = subset_name(cfg.components)
        rows.append(
            {
                "trial_id": metrics.get("trial_id", ""),
                "components": subset,
                "method": method_label(subset),
                **{k: v for k, v in config.items() if k != "components" and k not in distributions.ENCODING_KEYS},
                "val_acc": metrics.get("val_acc"),
                "best_val_acc": metrics.get("best_val_acc"),
                "test_acc": metrics.get("test_acc"),
                "step": metrics.get("step"),
                "trainable_params": metrics.get("trainable_params"),
                "images_per_s": images_per_s(result, cfg.batch_size * cfg.grad_accum_steps),  # the effective batch
                "log10_trainable_params": _log10(metrics.get("trainable_params")),
                "best_val_loss": _lowest(result, "val_loss"),
                **{k: metrics.get(k) for k in TRIAL_TIMES},
                "max_steps": config.get("max_steps", plan.settings.max_steps),
                "diverged": bool(metrics.get("diverged", 0)),
                "over_budget": bool(metrics.get("over_budget", 0)),
                "error": None if result.error is None else str(result.error).splitlines()[0][:200],
                **(predictors.trial_scores(cfg) if predictors is not None else {}),
            }
        )
        curves.append(val_curve(result))
    reached = [max(curve) for curve, row in zip(curves, rows) if curve and not row["diverged"] and row["error"] is None]
    common = min(reached) if reached else None
    for row, curve in zip(rows, curves):
        row["common_step"], row["val_acc_common"] = common, curve.get(common)
    return pd.DataFrame(rows)


def write_trials(result: SearchResult) -> Path | None:
    """Write the trial table as ``trials.csv`` in the search's directory (None for remote storage or no trials).

    Read it back with ``read_trials`` (ids as text); the parent run also holds it as ``trials.json``, a
    table the MLflow UI shows with the ids as text (its CSV preview reads "00012" as 12).
    """
    directory = result.plan.local_dir
    if directory is None or result.trials.empty:
        return None
    path = directory / "trials.csv"
    result.trials.to_csv(path, index=False)
    return path


def read_trials(directory: Path) -> pd.DataFrame:
    """The trial table a finished search wrote in ``directory`` (``write_trials``), trial and run ids as text."""
    from vitplast_tune.errors import UserError

    path = directory / "trials.csv"
    if not path.is_file():
        raise UserError(f'search "{directory.name}" in {directory.parent} has not finished: no trial table to analyze')
    return pd.read_csv(path, dtype={"trial_id": str, "run_id": str})


def trial_result(grid, trial_id: str):
    """The result of trial ``trial_id`` in a result grid (its config, metrics and last checkpoint), or None."""
    for result in grid:
        if (result.metrics or {}).get("trial_id") == trial_id:
            return result
    return None


def val_curve(result, metric: str = "val_acc") -> dict[int, float]:
    """Validation accuracy (or another reported ``metric``) by step, from every report of a trial."""
    frame = result.metrics_dataframe
    if frame is None or metric not in frame or "step" not in frame:
        return {}
    frame = frame.dropna(subset=["step", metric])
    return dict(zip(frame["step"].astype(int), frame[metric].astype(float)))


def metric_curves(grid, metrics: list[str]) -> dict[str, dict[str, dict[int, float]]]:
    """Each trial's curve of each of ``metrics``: trial id -> metric -> {step: value}."""
    return {
        str((result.metrics or {}).get("trial_id", "")): {m: val_curve(result, m) for m in metrics} for result in grid
    }


def images_per_s(result, batch_size: int) -> float | None:
    """A trial's training throughput: the median over its reports of steps/s (training steps only) times the batch
    size."""
    frame = result.metrics_dataframe
    if frame is None or "steps_per_s" not in frame or frame["steps_per_s"].dropna().empty:
        return None
    return float(frame["steps_per_s"].dropna().median() * batch_size)


# What each Pareto front trades accuracy against: (column, "min" when less is better, label).
PARETO_AXES: tuple[tuple[str, str, str], ...] = (
    ("trainable_params", "min", "fewer trainable parameters"),
    ("images_per_s", "max", "more training images/s"),
)


def pareto_front(trials: pd.DataFrame, cost: str, better: str = "min", accuracy: str = "best_val_acc") -> pd.DataFrame:
    """The full-budget trials that no other full-budget trial beats on both ``accuracy`` (higher) and ``cost``
    (lower when ``better`` is "min", higher when "max"), sorted from the cheapest; ties keep the first."""
    from vitplast_tune.analysis.trials import finished_trials

    if trials.empty or cost not in trials or accuracy not in trials:
        return trials.head(0)
    done = finished_trials(trials).dropna(subset=[cost, accuracy])
    ordered = done.sort_values([cost, accuracy], ascending=[better == "min", False], kind="stable")
    best_before = ordered[accuracy].cummax().shift(fill_value=-float("inf"))
    return ordered[ordered[accuracy] > best_before]


def write_pareto(result: SearchResult) -> list[Path]:
    """Each Pareto front as CSV and PNG (``pareto_<cost>.csv``/``.png``) in the search's ``analysis`` folder."""
    from vitplast_tune.analysis.plots import plot_pareto

    out = result.plan.results_dir / "analysis"
    files: list[Path] = []
    for cost, better, _ in PARETO_AXES:
        front = pareto_front(result.trials, cost, better)
        if front.empty:
            continue
        out.mkdir(parents=True, exist_ok=True)
        front.to_csv(out / f"pareto_{cost}.csv", index=False)
        files += [out / f"pareto_{cost}.csv", plot_pareto(result.trials, front, cost, out / f"pareto_{cost}.png")]
    return files


def _lowest(result, column: str) -> float | None:
    frame = result.metrics_dataframe
    if frame is None or column not in frame or frame[column].dropna().empty:
        return None
    return float(frame[column].min())


def _log10(value: Any) -> float | None:
    return math.log10(value) if isinstance(value, (int, float)) and not pd.isna(value) and value > 0 else None


def top_trials(result: SearchResult, k: int = 10) -> pd.DataFrame:
    """The ``k`` best trials by best validation accuracy (or the space's metric when it is not accuracy)."""
    trials = result.trials
    if trials.empty:
        return trials
    spec = result.plan.spec
    column = "best_val_acc" if spec.metric == "val_acc" else spec.metric
    if column not in trials:
        column = "val_acc"
    ok = trials[~trials["diverged"] & trials[column].notna()]
    return ok.sort_values(column, ascending=spec.mode == "min").head(k)


def summary(result: SearchResult, k: int = 10) -> str:
    """The text a person reads at the end: top trials, where results lie, how to open MLflow."""
    plan = result.plan
    top = top_trials(result, k)
    lines = [
        f"Search {plan.name}: {len(result.trials)} trials in {result.elapsed_s / 60:.1f} min "
        f"({plan.spec.algorithm}, scheduler {plan.spec.scheduler.name}, {plan.settings.model} on {plan.settings.dataset}, "
        f"{augmentation_text(plan)})"
    ]
    if result.timings is not None:
        lines.append(result.timings.describe())
    failed = (
        int(result.trials["diverged"].sum() + result.trials["error"].notna().sum()) if not result.trials.empty else 0
    )
    if failed:
        lines.append(f"{failed} trial(s) failed or diverged; see their MLflow runs for the reason")
    if not top.empty:
        lines += [
            "",
            f"Top {len(top)} trials (best validation accuracy; test accuracy of its best-validation weights):",
            _top_table(top).to_string(index=False),
        ]
        lines += ["", text] if (text := describe_pareto(result.trials)) else []
    if result.analysis is not None and (text := result.analysis.describe()):
        lines += ["", text]
    lines += ["", f"Results (Ray Tune): {plan.location}"]
    if plan.local_dir is not None:
        lines.append(f"Trial table:        {plan.local_dir / 'trials.csv'}")
    if result.study is not None:
        lines.append(result.study.describe())
    return "\n".join(lines + _mlflow_lines(result))


def _mlflow_lines(result: SearchResult) -> list[str]:
    """Where the runs are, the command that opens them in the MLflow UI, the view's link, the best trial's run and the
    lines that load the best model."""
    plan = result.plan
    lines = [f"MLflow runs:        {plan.tracking_uri}   (experiment '{plan.experiment}', parent run '{plan.name}')"]
    if command := ui_command(plan):
        lines.append(f"MLflow UI:          {command}" + ("   (serves the view below)" if plan.local_dir else ""))
    if result.view is not None:
        lines.append(f"MLflow view:        {result.view.link}")
        if result.view.note:
            lines.append(f"                    ({result.view.note})")
    if result.best_run_id and result.view is not None:
        link = run_link(ui_base_url(plan.tracking_uri), result.view.experiment_id, result.best_run_id)
        lines.append(f"Best trial's run:   {link}")
    loaders = [f'mlflow.pytorch.load_model("{result.best_model_uri}")'] if result.best_model_uri else []
    if result.best_run_id and plan.local_dir is not None:  # the record that load_best_model finds it by
        storage = "" if _in_default_storage(plan) else f', storage="{plan.storage}"'
        loaders.append(f'vitplast_tune.load_best_model("{plan.name}"{storage})')
    return lines + [f"{'Best model:' if i == 0 else '':<20}{loader}" for i, loader in enumerate(loaders)]


def ui_command(plan: SearchPlan) -> str | None:
    """The command that starts the MLflow UI on the search's store (None when it records to a server):
    ``vitplast-ui NAME``, or ``mlflow ui`` when the search keeps no record (remote storage)."""
    if plan.tracking_uri.startswith(("http://", "https://")):
        return None
    if plan.local_dir is None:
        return f"mlflow ui --backend-store-uri {plan.tracking_uri} --host 127.0.0.1"
    return f"vitplast-ui {plan.name}" + ("" if _in_default_storage(plan) else f" --storage {plan.storage}")


def _in_default_storage(plan: SearchPlan) -> bool:
    return plan.local_dir is not None and Path(plan.storage) == default_storage().resolve()


def augmentation_text(plan: SearchPlan) -> str:
    """Which training augmentation the trials used: the settings' recipe, or the recipes the space searches."""
    searched = searched_augmentations(plan.spec)
    if len(set(searched)) > 1:
        return f"augmentation searched: {', '.join(map(str, dict.fromkeys(searched)))}"
    return f"augmentation {searched[0] if searched else plan.settings.augment}"


def _top_table(top: pd.DataFrame) -> pd.DataFrame:
    """The columns a person reads per trial; the method and depth when some trial trains otherwise than in full (or
    as the linear probe), in every block."""
    where_and_how = {}
    if "method" in top and (~top["method"].fillna("full").isin(["full", "head"])).any():
        where_and_how["method"] = top["method"]
    if "depth" in top and (top["depth"].fillna("all") != "all").any():
        where_and_how["depth"] = top["depth"]
    return pd.DataFrame(
        {
            "components": top["components"],
            **where_and_how,
            "lr": top["lr"].map(lambda v: f"{v:.3g}") if "lr" in top else "",
            "val_acc": top["val_acc"].map(pct),
            "best_val_acc": top["best_val_acc"].map(pct),
            "test_acc": top["test_acc"].map(pct),
            "steps": top["step"].map(lambda v: "" if pd.isna(v) else int(v)),
            "trainable": top["trainable_params"].map(lambda v: "" if pd.isna(v) else f"{int(v):,}"),
        }
    )


def describe_pareto(trials: pd.DataFrame) -> str:
    """The Pareto blocks printed under the top table: per axis, the trials no other full-budget trial beats on both."""
    lines: list[str] = []
    for cost, better, label in PARETO_AXES:
        front = pareto_front(trials, cost, better)
        if front.empty:
            continue
        table = _top_table(front).drop(columns=["val_acc", "steps"])
        if cost == "images_per_s":
            table["images/s"] = front["images_per_s"].map(lambda v: f"{v:,.0f}")
        lines += [
            f"Pareto front, best validation accuracy vs {label} ({len(front)} of the full-budget trials; "
            "no other one is better on both):",
            table.to_string(index=False),
            "",
        ]
    return "\n".join(lines).rstrip()


def trial_label(config: dict[str, Any]) -> str:
    """A trial's short name: its subset (and methods), depth and learning rate, e.g. "mha:lora+fc1 @last lr=0.0312"."""
    lr, depth = config.get("lr"), config.get("depth", "all")
    where = "" if depth == "all" else f" @{depth}"
    return trial_subset(config) + where + (f" lr={lr:.3g}" if isinstance(lr, (int, float)) else "")


def pct(value: Any) -> str:
    """An accuracy as a percentage with two decimals ("" for a missing value)."""
    return "" if value is None or pd.isna(value) else f"{100 * float(value):.2f}%"
