"""The text a search prints at its end, and that text kept in its results folder for ``Search.summary()``."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pandas as pd

from vitplast_tune.log import get_logger
from vitplast_tune.storage import spoken

SUMMARY_FILE = "summary.txt"  # the summary a search printed at its end, in its results folder
TOP_TRIALS = 10  # how many top trials the printed summary shows

log = get_logger(__name__)


def summary(search: Any, k: int = TOP_TRIALS) -> str:
    """Write the text a person reads at a search's end, from what the ``Search`` holds.

    Args:
        search: The search (a ``records.search.Search``).
        k: How many top trials to show.

    Returns:
        The answer, the time, the top trials, the analysis, and where the records lie.
    """
    from vitplast_tune.records.answer import answer_lines
    from vitplast_tune.records.cost import cost_lines
    from vitplast_tune.records.pareto import describe_pareto
    from vitplast_tune.records.search_run import augmentation_text
    from vitplast_tune.records.study import describe_study
    from vitplast_tune.records.table import display_table, top_trials
    from vitplast_tune.space.objectives import objective_of

    place, spec, settings, trials = search.place, search.spec, search.settings, search.trials
    top = top_trials(search.search_trials, spec, k)  # the finalists are in the answer
    objective = objective_of(spec)
    answer = answer_lines(trials, search.analysis) if spec.metric == "val_acc" or objective != "accuracy" else []
    answer += cost_lines(trials, objective) if answer else []
    elapsed = f" in {search.elapsed_s / 60:.1f} min" if search.elapsed_s > 0 else ""
    lines = [*answer, *([""] if answer else [])]
    lines.append(
        f"Search {place.name}: {len(trials)} trials{elapsed} ({spec.algorithm}, scheduler {spec.scheduler.name}, "
        f"{settings.model} on {settings.dataset}, {augmentation_text(spec, settings)})"
    )
    if search.timings is not None:
        lines.append(search.timings.describe())
    failed = int(trials["diverged"].sum()) + int(trials["error"].notna().sum()) if not trials.empty else 0
    if failed:
        lines.append(f"{failed} trial(s) failed or diverged; see their MLflow runs for the reason")
        lines += _failure_lines(trials)
    if not top.empty:
        lines += [
            "",
            f"Top {len(top)} trials (best validation accuracy; test accuracy of its best-validation weights):",
        ]
        lines.append(display_table(top).to_string(index=False))
        lines += ["", text] if (text := describe_pareto(trials)) else []
    if search.analysis is not None and (text := search.analysis.describe()):
        lines += ["", text]
    lines += ["", f"Results (Ray Tune): {spoken(place.location)}"]
    if place.local_dir is not None:
        lines.append(f"Trial table:        {spoken(place.local_dir / 'trials.csv')}")
    if text := describe_study(search.directory, search.name):
        lines.append(text)
    return "\n".join(lines + _mlflow_lines(search))


def keep_summary(search: Any) -> str:
    """Write the summary, keep it whole in ``summary.txt`` for ``Search.summary()``, and return it to print.

    A folder that cannot take it keeps none, said in a warning.
    """
    text = summary(search)
    folder = search.directory
    partial = folder / f".{SUMMARY_FILE}.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial.write_text(text + "\n", encoding="utf-8")
        os.replace(partial, folder / SUMMARY_FILE)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        log.warning(f"warning: the summary is not kept in {folder / SUMMARY_FILE} ({exc.strerror or exc})")
    return text


def kept_summary(folder: Path) -> str | None:
    """Read the summary a search kept in its results folder, less the newline ``print`` adds; None without one."""
    path = folder / SUMMARY_FILE
    return path.read_text(encoding="utf-8").removesuffix("\n") if path.is_file() else None


def forget_summary(folder: Path) -> None:
    """Remove the summary a search kept, once its analysis is done again and the text no longer says it."""
    (folder / SUMMARY_FILE).unlink(missing_ok=True)


def _failure_lines(trials: pd.DataFrame, most: int = 5) -> list[str]:
    """Write the cause of each trial that failed with an error, the first ``most`` of them, one line each."""
    errors = trials[trials["error"].notna()]
    lines = [f"  trial {r['trial_id']} ({r['components']}): {r['error']}" for _, r in errors.head(most).iterrows()]
    return lines + ([f"  ... and {len(errors) - most} more"] if len(errors) > most else [])


def _mlflow_lines(search: Any) -> list[str]:
    """Write where the runs are, how to open them in the MLflow UI, and how to load the best model."""
    from vitplast_tune.records.view import run_link, ui_base_url, ui_command

    place, view = search.place, search.view
    lines = [
        f"MLflow runs:        {spoken(place.tracking_uri)}   (experiment '{place.experiment}', parent run '{place.name}')"
    ]
    if command := ui_command(place):
        lines.append(f"MLflow UI:          {command}" + ("   (serves the view below)" if place.local_dir else ""))
    if view is not None:
        lines.append(f"MLflow view:        {view.link}")
        if view.note:
            lines.append(f"                    ({view.note})")
    if search.best_run_id and view is not None:
        lines.append(
            f"Best trial's run:   {run_link(ui_base_url(place.tracking_uri), view.experiment_id, search.best_run_id)}"
        )
    loaders = [f'mlflow.pytorch.load_model("{search.best_model_uri}")'] if search.best_model_uri else []
    if search.best_run_id and place.local_dir is not None:  # the record that load_best_model finds it by
        storage = "" if place.in_default_storage() else f', storage="{place.storage}"'
        loaders.append(f'vitplast_tune.load_best_model("{place.name}"{storage})')
    return lines + [f"{'Best model:' if i == 0 else '':<20}{loader}" for i, loader in enumerate(loaders)]
