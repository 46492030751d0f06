"""What a finished search returns (``SearchResult``: its trials and where everything lies) and the text a person
reads at the end: the top trials, the Pareto fronts, the analysis, and where the results, MLflow runs, Optuna study
and best model are; that text kept as printed (``summary.txt``), which ``Search.summary()`` reads back."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from vitplast_tune.analysis.analyze import SearchAnalysis
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.log import get_logger
from vitplast_tune.records.answer import answer_lines
from vitplast_tune.records.cost import cost_lines
from vitplast_tune.records.pareto import describe_pareto
from vitplast_tune.records.study import StudyRecord
from vitplast_tune.records.table import display_table, search_trials, top_trials
from vitplast_tune.records.view import View, run_link, ui_base_url
from vitplast_tune.space.files import SearchSpec, searched_augmentations
from vitplast_tune.space.objectives import objective_of
from vitplast_tune.storage import SearchPlace, spoken
from vitplast_tune.timings import Timings

SUMMARY_FILE = "summary.txt"  # the summary a search printed at its end, in its results folder
TOP_TRIALS = 10  # how many of the top trials the printed summary shows

log = get_logger(__name__)


@dataclass
class SearchResult:
    """A finished search: its trials (one row each) and where everything lies.

    Attributes:
        place: Its name, storage, MLflow tracking URI and experiment.
        spec: Its space.
        settings: What every trial did, before its sampled parameters.
        trials: The trial table, one row per trial.
        parent_run_id: The id of its MLflow parent run.
        elapsed_s: Its wall time in seconds (0: not timed by this process, analyzed again from its records).
        analysis: Its analysis (None: not analyzed).
        view: Its MLflow UI view and the view's link.
        timings: Seconds per phase.
        study: Its Optuna study.
        best_model_uri: ``runs:/<parent>/best_model``: the best trial's model (``mlflow.pytorch.load_model``).
        best_run_id: The best trial's MLflow run (tagged vitplast.best).
        notes: Adjustments the search made and said (e.g. a clamped grace period).
    """

    place: SearchPlace  # its name, storage, MLflow tracking URI and experiment
    spec: SearchSpec
    settings: FinetuneConfig  # what every trial did, before its sampled parameters
    trials: pd.DataFrame
    parent_run_id: str
    elapsed_s: float = 0.0
    analysis: SearchAnalysis | None = None
    view: View | None = None  # the search's MLflow UI view and its link
    timings: Timings | None = None  # seconds per phase
    study: StudyRecord | None = None  # the search's Optuna study
    best_model_uri: str | None = None  # runs:/<parent>/best_model: the best trial's model (mlflow.pytorch.load_model)
    best_run_id: str | None = None  # the best trial's MLflow run (tagged vitplast.best)
    notes: list[str] = field(default_factory=list)  # adjustments the search made and said (e.g. a clamped grace period)

    @property
    def search_trials(self) -> pd.DataFrame:
        """The trial table's trials of the search itself, without its finalists (``space.finalists``)."""
        return search_trials(self.trials)


def summary(result: SearchResult, k: int = TOP_TRIALS) -> str:
    """Summarize a finished search as the text a person reads at the end.

    The answer comes first, then where the time went, the top trials, the analysis, where results lie and how to
    open MLflow.

    Args:
        result: The finished search.
        k: How many top trials to show.

    Returns:
        The text.
    """
    place, spec, settings = result.place, result.spec, result.settings
    top = top_trials(result.search_trials, spec, k)  # the finalists are in the answer
    objective = objective_of(spec)
    answer = answer_lines(result.trials, result.analysis) if spec.metric == "val_acc" or objective != "accuracy" else []
    answer += cost_lines(result.trials, objective) if answer else []
    lines = (
        answer
        + ([""] if answer else [])
        + [
            f"Search {place.name}: {len(result.trials)} trials{_elapsed(result.elapsed_s)} "
            f"({spec.algorithm}, scheduler {spec.scheduler.name}, {settings.model} on {settings.dataset}, "
            f"{augmentation_text(spec, settings)})"
        ]
    )
    if result.timings is not None:
        lines.append(result.timings.describe())
    failed = (
        int(result.trials["diverged"].sum() + result.trials["error"].notna().sum()) if not result.trials.empty else 0
    )
    if failed:
        lines.append(f"{failed} trial(s) failed or diverged; see their MLflow runs for the reason")
        lines += _failure_lines(result.trials)
    if not top.empty:
        lines += [
            "",
            f"Top {len(top)} trials (best validation accuracy; test accuracy of its best-validation weights):",
            display_table(top).to_string(index=False),
        ]
        lines += ["", text] if (text := describe_pareto(result.trials)) else []
    if result.analysis is not None and (text := result.analysis.describe()):
        lines += ["", text]
    lines += ["", f"Results (Ray Tune): {spoken(place.location)}"]
    if place.local_dir is not None:
        lines.append(f"Trial table:        {spoken(place.local_dir / 'trials.csv')}")
    if result.study is not None:
        lines.append(result.study.describe())
    return "\n".join(lines + _mlflow_lines(result))


def keep_summary(result: SearchResult) -> str:
    """Summarize a finished search and keep the text as it is printed, for ``Search.summary()`` to read back.

    The text goes to ``SUMMARY_FILE`` in the search's results folder whole or not at all (a temporary file renamed
    over the old one), with the newline ``print`` adds. A folder that cannot take it keeps none, said in a warning:
    ``Search.summary()`` then rebuilds the text from the records.

    Args:
        result: The finished search.

    Returns:
        The text, for the caller to print.
    """
    text = summary(result)
    folder = result.place.results_dir
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
    """Read the summary a search printed at its end (``keep_summary``) from its results folder.

    Args:
        folder: The search's results folder.

    Returns:
        The text as printed, less the newline ``print`` adds; None when the folder keeps none.
    """
    path = folder / SUMMARY_FILE
    return path.read_text(encoding="utf-8").removesuffix("\n") if path.is_file() else None


def forget_summary(folder: Path) -> None:
    """Remove the summary a search kept, once its analysis is done again and the text no longer says it.

    Args:
        folder: The search's results folder.
    """
    (folder / SUMMARY_FILE).unlink(missing_ok=True)


def _failure_lines(trials: pd.DataFrame, most: int = 5) -> list[str]:
    """The cause of each trial that failed with an error (the first ``most``), one line each."""
    errors = trials[trials["error"].notna()]
    lines = [f"  trial {row.trial_id} ({row.components}): {row.error}" for row in errors.head(most).itertuples()]
    return lines + ([f"  ... and {len(errors) - most} more"] if len(errors) > most else [])


def _elapsed(seconds: float) -> str:
    """ " in 2.1 min", or "" for a search this process did not time (analyzed again from its records)."""
    return f" in {seconds / 60:.1f} min" if seconds > 0 else ""


def _mlflow_lines(result: SearchResult) -> list[str]:
    """Where the runs are, the command that opens them in the MLflow UI, the view's link, the best trial's run and the
    lines that load the best model."""
    place = result.place
    lines = [
        f"MLflow runs:        {spoken(place.tracking_uri)}   (experiment '{place.experiment}', parent run '{place.name}')"
    ]
    if command := ui_command(place):
        lines.append(f"MLflow UI:          {command}" + ("   (serves the view below)" if place.local_dir else ""))
    if result.view is not None:
        lines.append(f"MLflow view:        {result.view.link}")
        if result.view.note:
            lines.append(f"                    ({result.view.note})")
    if result.best_run_id and result.view is not None:
        link = run_link(ui_base_url(place.tracking_uri), result.view.experiment_id, result.best_run_id)
        lines.append(f"Best trial's run:   {link}")
    loaders = [f'mlflow.pytorch.load_model("{result.best_model_uri}")'] if result.best_model_uri else []
    if result.best_run_id and place.local_dir is not None:  # the record that load_best_model finds it by
        storage = "" if place.in_default_storage() else f', storage="{place.storage}"'
        loaders.append(f'vitplast_tune.load_best_model("{place.name}"{storage})')
    return lines + [f"{'Best model:' if i == 0 else '':<20}{loader}" for i, loader in enumerate(loaders)]


def ui_command(place: SearchPlace) -> str | None:
    """Write the command that starts the MLflow UI on the search's store.

    Args:
        place: Where the search keeps its records.

    Returns:
        ``vitplast ui NAME``, or ``mlflow ui`` when the search keeps no record (remote storage); None when it records
        to a server.
    """
    if place.tracking_uri.startswith(("http://", "https://")):
        return None
    if place.local_dir is None:
        return f"mlflow ui --backend-store-uri {spoken(place.tracking_uri)} --host 127.0.0.1"
    return f"vitplast ui {place.name}" + ("" if place.in_default_storage() else f" --storage {spoken(place.storage)}")


def augmentation_text(spec: SearchSpec, settings: FinetuneConfig) -> str:
    """Which training augmentation the trials used: the settings' recipe, or the recipes the space searches."""
    searched = searched_augmentations(spec)
    if len(set(searched)) > 1:
        return f"augmentation searched: {', '.join(map(str, dict.fromkeys(searched)))}"
    return f"augmentation {searched[0] if searched else settings.augment}"
