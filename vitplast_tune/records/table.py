"""A search's trial table, one row per trial, read from Ray Tune's result grid and kept as ``trials.csv``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from vitplast_tune.components import ALL, method_label, subset_name
from vitplast_tune.config import NOT_SETTINGS, FinetuneConfig, trial_config
from vitplast_tune.predictors import report
from vitplast_tune.predictors.scores import log_trainable_params
from vitplast_tune.space.baselines import FINALIST, SEARCH, stage_of
from vitplast_tune.space.files import SearchSpec
from vitplast_tune.space.finalists import finalist_of
from vitplast_tune.storage import replaced

# Where a trial's time went: finetune's cumulative timings at its last report.
TRIAL_TIMES = ("time_setup_s", "time_in_steps_s", "time_in_eval_s")


def trial_table(
    grid: Iterable[Any], settings: FinetuneConfig, predictors: report.Predictors | None = None
) -> pd.DataFrame:
    """Tabulate a search's trials, one row each: subset, parameters, metrics, stage, status and predictors.

    ``val_acc_common`` is each trial's validation accuracy at ``common_step``, the last evaluation every trial reached.

    Args:
        grid: Ray Tune's result grid, or results with its ``config``, ``metrics``, ``error`` and ``metrics_dataframe``.
        settings: What every trial does, before its sampled parameters.
        predictors: The pre-training predictors, whose scores each row gets (None: no scores).

    Returns:
        The trial table.
    """
    rows, curves = [], []
    for result in grid:
        config, metrics = result.config or {}, result.metrics or {}
        cfg = trial_config(config, settings)
        subset, mark = subset_name(cfg.components), finalist_of(config)
        rows.append(
            {
                "trial_id": metrics.get("trial_id", ""),
                "components": subset,
                "method": method_label(subset),
                **{k: v for k, v in config.items() if k != "components" and k not in NOT_SETTINGS},
                "stage": stage_of(config),
                "seed": cfg.seed,
                "finalist": mark["index"] if mark else None,
                "lr_from": mark["lr_from"] if mark else None,
                "val_acc": metrics.get("val_acc"),
                "best_val_acc": metrics.get("best_val_acc"),
                "test_acc": metrics.get("test_acc"),
                "step": metrics.get("step"),
                "trainable_params": metrics.get("trainable_params"),
                "images_per_s": _images_per_s(result, cfg.batch_size * cfg.grad_accum_steps),  # the effective batch
                "log10_trainable_params": log_trainable_params(metrics.get("trainable_params")),
                "best_val_loss": _lowest(result, "val_loss"),
                **{k: metrics.get(k) for k in TRIAL_TIMES},
                **_trial_span(metrics),
                "val_acc_per_gpu_hour": metrics.get("val_acc_per_gpu_hour"),  # at its last report, as Optuna got it
                "max_steps": config.get("max_steps", settings.max_steps),
                "diverged": bool(metrics.get("diverged", 0)),
                "over_budget": bool(metrics.get("over_budget", 0)),
                "error": None if result.error is None else error_line(result.error),
                **(predictors.trial_scores(cfg) if predictors is not None else {}),
            }
        )
        curves.append(_curve(result))
    reached = [max(curve) for curve, row in zip(curves, rows) if curve and not row["diverged"] and row["error"] is None]
    common = min(reached) if reached else None
    for row, curve in zip(rows, curves):
        row["common_step"], row["val_acc_common"] = common, curve.get(common)
    return pd.DataFrame(rows)


def search_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """Keep the trials of the search itself, its reference trials included, without its finalists."""
    return trials[trials["stage"] != FINALIST] if "stage" in trials else trials


def sampled_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """Keep the trials the search's sampler drew: no reference trial, no finalist."""
    return trials[trials["stage"] == SEARCH] if "stage" in trials else trials


def finalist_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """Keep the finalists' trials of a trial table."""
    return trials[trials["stage"] == FINALIST] if "stage" in trials else trials.iloc[0:0]


def write_trials(trials: pd.DataFrame, directory: Path | None) -> Path | None:
    """Write the trial table as ``trials.csv`` in the search's directory, unless it is empty.

    Args:
        trials: The trial table.
        directory: The search's directory (None: remote storage, nothing written).

    Returns:
        The file written, or None when nothing was.
    """
    if directory is None or trials.empty:
        return None
    path = directory / "trials.csv"
    with replaced(path) as partial:  # whole or not at all: a full disk leaves the table read back as it was
        trials.to_csv(partial, index=False)
    return path


def read_trials(directory: Path) -> pd.DataFrame:
    """Read the trial table a finished search wrote in its directory.

    Args:
        directory: The search's directory.

    Returns:
        The trial table, trial and run ids as text.

    Raises:
        UserError: The search has not finished (no table), or its table is damaged.
    """
    from vitplast_tune.errors import UserError

    path = directory / "trials.csv"
    if not path.is_file():
        raise UserError(f'search "{directory.name}" in {directory.parent} has not finished: no trial table to analyze')
    problem = _table_problem(path)
    if problem is None:
        try:
            table = pd.read_csv(path, dtype={"trial_id": str, "run_id": str})
        except (ValueError, UnicodeDecodeError) as exc:  # pandas' ParserError is a ValueError
            problem = " ".join(str(exc).split())[:200]
        else:
            problem = _column_problem(table)
    if problem is not None:
        raise UserError(
            f"the trial table {path} is damaged ({problem}); move it aside and run the search again with "
            "--resume (its trials do not run again: the table is written anew from Ray Tune's records)"
        )
    return table


def _table_problem(path: Path) -> str | None:
    """Say what is wrong with a trial table's CSV file (cut short, rows of another width); None when it looks whole."""
    import csv

    text = path.read_bytes()
    if not text.strip():
        return "empty"
    if not text.endswith(b"\n"):
        return "cut short: its last line is not whole"
    try:
        rows = list(csv.reader(text.decode().splitlines()))
    except (csv.Error, UnicodeDecodeError) as exc:
        return str(exc)
    width = len(rows[0])
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != width:
            return f"line {number} has {len(row)} fields, the header {width}"
    return None


def _column_problem(table: pd.DataFrame) -> str | None:
    """Find a missing column, or a flag column that does not read as true and false."""
    missing = [c for c in ("trial_id", "components", "best_val_acc", "diverged") if c not in table]
    if missing:
        return f"no column {missing[0]}"
    for column in ("diverged", "over_budget"):
        if column in table and table[column].dtype != bool:
            return f"column {column} holds values other than True and False"
    return None


def trial_result(grid, trial_id: str):
    """Find the result of trial ``trial_id`` in a result grid; None when it is not there."""
    for result in grid:
        if (result.metrics or {}).get("trial_id") == trial_id:
            return result
    return None


def _curve(result, metric: str = "val_acc") -> dict[int, float]:
    """Read a reported metric of a trial by step."""
    frame = result.metrics_dataframe
    if frame is None or metric not in frame or "step" not in frame:
        return {}
    frame = frame.dropna(subset=["step", metric])
    return dict(zip(frame["step"].astype(int), frame[metric].astype(float)))


def metric_curves(grid, metrics: list[str]) -> dict[str, dict[str, dict[int, float]]]:
    """Read each trial's curve of each of ``metrics``: trial id -> metric -> {step: value}."""
    return {str((result.metrics or {}).get("trial_id", "")): {m: _curve(result, m) for m in metrics} for result in grid}


def _images_per_s(result, batch_size: int) -> float | None:
    """Return a trial's training throughput: its median steps/s over its reports times the batch size."""
    frame = result.metrics_dataframe
    if frame is None or "steps_per_s" not in frame or frame["steps_per_s"].dropna().empty:
        return None
    return float(frame["steps_per_s"].dropna().median() * batch_size)


def _trial_span(metrics: dict[str, Any]) -> dict[str, float | None]:
    """Say when a trial started and ended, in Unix seconds, from its last report's time and running time."""
    ended, ran = metrics.get("timestamp"), metrics.get("time_total_s")
    known = isinstance(ended, (int, float)) and isinstance(ran, (int, float))
    return {"started_at": float(ended - ran) if known else None, "ended_at": float(ended) if known else None}


def _lowest(result, column: str) -> float | None:
    frame = result.metrics_dataframe
    if frame is None or column not in frame or frame[column].dropna().empty:
        return None
    return float(frame[column].min())


def top_trials(trials: pd.DataFrame, spec: SearchSpec, k: int = 10) -> pd.DataFrame:
    """Pick the ``k`` best trials by best validation accuracy (or the space's metric when it is not accuracy).

    Args:
        trials: The trial table.
        spec: The search's space (its metric and mode).
        k: How many trials to keep.

    Returns:
        The best trials, best first, without diverged trials and trials lacking the metric.
    """
    if trials.empty:
        return trials
    column = "best_val_acc" if spec.metric == "val_acc" else spec.metric
    if column not in trials:
        column = "val_acc"
    ok = trials[~trials["diverged"] & trials[column].notna()]
    return ok.sort_values(column, ascending=spec.mode == "min", kind="stable").head(k)


def error_line(error: BaseException | str) -> str:
    """Put a trial's error in one line: the last line of its text, at most 500 characters, or "error"."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1].strip()[:500] if lines else "error"


def trial_label(config: dict[str, Any]) -> str:
    """Name a trial by its subset, depth and learning rate: "mha:lora+fc1 @last lr=0.0312"."""
    lr, depth = config.get("lr"), config.get("depth", "all")
    where = "" if depth == "all" else f" @{depth}"
    return (
        subset_name(config.get("components", ALL)) + where + (f" lr={lr:.3g}" if isinstance(lr, (int, float)) else "")
    )


def trial_subset(config: dict[str, Any]) -> str:
    """Name the subset a trial's config trains ("all" when the space names none)."""
    return subset_name(config.get("components", ALL))


def pct(value: Any) -> str:
    """Write an accuracy as a percentage with two decimals ("" for a missing value)."""
    return "" if value is None or pd.isna(value) else f"{100 * float(value):.2f}%"


def display_table(top: pd.DataFrame) -> pd.DataFrame:
    """Pick the columns a person reads per trial; the method and depth where some trial does not train in full."""
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


def instruction(row: dict[str, Any]) -> str:
    """Say what to finetune as the answer does: "mha+fc1 in the last blocks at lr 0.0312"."""
    depth = row.get("depth")
    where = f" in the {depth} blocks" if isinstance(depth, str) and depth not in ("", "all") else ""
    lr = row.get("lr")
    return (
        f"{row['components']}{where} at lr {lr:.3g}"
        if lr is not None and pd.notna(lr)
        else f"{row['components']}{where}"
    )


def params_text(row: dict[str, Any]) -> str:
    """Write a trial's trainable parameters as the answer does: "468,778", or "?" where unknown."""
    return "?" if pd.isna(row.get("trainable_params")) else f"{int(row['trainable_params']):,}"
