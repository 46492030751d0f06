"""A search as its driver returns it and as ``load_search`` reads it back from its records, without Ray."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from vitplast_tune.errors import SearchNotFound, UserError
from vitplast_tune.lock import running_owner
from vitplast_tune.records.printed import TOP_TRIALS, kept_summary, summary
from vitplast_tune.storage import SEARCH_FILE, STUDY_FILE, SearchPlace, default_storage, read_record
from vitplast_tune.type_checks import checked

if TYPE_CHECKING:  # annotations only: loading a search's records imports no torch
    import optuna
    from torch import nn

    from vitplast_tune.analysis.analyze import SearchAnalysis
    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.records.answer import Answer
    from vitplast_tune.records.finalists import FinalAnswer
    from vitplast_tune.records.view import View
    from vitplast_tune.space.files import SearchSpec
    from vitplast_tune.timings import Timings

STATUSES = ("finished", "pruned", "failed")  # a trial's status in ``Search.trials`` (Optuna: COMPLETE, PRUNED, FAIL)


@checked()
def list_searches(storage: str | Path | None = None) -> list[str]:
    """List the names of the searches recorded in a storage folder, sorted.

    Args:
        storage: The storage root (default: ``$VITPLAST_RESULTS_DIR``, else ``~/vitplast_tune_results``).

    Returns:
        Each folder name under ``storage`` that holds a search record.
    """
    root = Path(storage or default_storage()).expanduser()
    if not root.is_dir():
        return []
    return sorted(p.parent.name for p in root.glob(f"*/{SEARCH_FILE}"))


@checked()
def load_search(name: str, storage: str | Path | None = None, tracking_uri: str | None = None) -> Search:
    """Read a recorded search back, finished or still running, without starting Ray.

    Args:
        name: The search's name (``--name``).
        storage: Its storage root (default: ``$VITPLAST_RESULTS_DIR``, else ``~/vitplast_tune_results``).
        tracking_uri: Its MLflow tracking URI, when the store moved (default: the one the search recorded to).

    Returns:
        The search.

    Raises:
        SearchNotFound: No search of that name is in ``storage``; the message lists the known ones.
    """
    root = Path(storage or default_storage()).expanduser().resolve()
    if not (root / name / SEARCH_FILE).is_file():
        known = list_searches(root)
        listed = f"known: {', '.join(known)}" if known else "it holds none"
        raise SearchNotFound(f'no search "{name}" in {root} ({listed}); check the name and the storage')
    record = read_record(root / name, purpose="recorded")
    uri = tracking_uri or record["tracking_uri"]
    return Search(
        SearchPlace(name, str(root), uri, record.get("experiment", "vitplast_tune"), record.get("search_id", "")),
        record,
    )


@dataclass
class Search:
    """A search: finished, as its driver returns it, or finished or running, as its records hold it.

    The driver fills the fields after ``record``; a search read back has them empty and reads its records instead.

    Attributes:
        place: Its name, storage, MLflow tracking URI and experiment.
        record: Its record (``storage.SEARCH_FILE``).
        table: The trial table its driver made (None: read from the records at each call).
        analysis: Its analysis (None: the summary reads the recorded one).
        view: Its MLflow UI view.
        timings: Seconds per phase of the driver that ran it.
        elapsed_s: That driver's wall time in seconds (0: the summary reads the recorded one).
        best_model_uri: ``runs:/<parent>/best_model``, the best trial's model.
        best_run_id: The best trial's MLflow run.
        notes: The adjustments the search made and said.
    """

    place: SearchPlace
    record: dict[str, Any] = field(repr=False)
    table: pd.DataFrame | None = field(default=None, repr=False)
    analysis: SearchAnalysis | None = None
    view: View | None = None
    timings: Timings | None = None
    elapsed_s: float = 0.0
    best_model_uri: str | None = None
    best_run_id: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The search's name."""
        return self.place.name

    @property
    def directory(self) -> Path:
        """The search's results folder."""
        return self.place.results_dir

    @property
    def parent_run_id(self) -> str:
        """The id of the search's MLflow parent run."""
        return self.record["parent_run_id"]

    @property
    def status(self) -> str:
        """Say ``running`` (its driver holds the lock), ``finished`` or ``stopped`` (``--resume`` continues it)."""
        if running_owner(self.directory) is not None:
            return "running"
        return "finished" if self.table is not None or (self.directory / "trials.csv").is_file() else "stopped"

    @cached_property
    def spec(self) -> SearchSpec:
        """The search's space, with the trial count, budgets, finalists and reference trials it ran."""
        from dataclasses import replace

        from vitplast_tune.space.files import load_space
        from vitplast_tune.space.finalists import Finalists

        budgets = self.record.get("budgets")
        spec = load_space(self.record["space_path"]).with_overrides(
            num_samples=self.record.get("num_samples"), budgets=tuple(budgets) if budgets else None
        )
        finalists = Finalists(**self.record.get("finalists", {}))
        return replace(spec, finalists=finalists, baselines=self.record.get("baselines", 0))

    @cached_property
    def settings(self) -> FinetuneConfig:
        """What every trial did before its sampled parameters."""
        from vitplast_tune.config import FinetuneConfig

        return FinetuneConfig.from_dict(self.record["settings"])

    @property
    def total_trials(self) -> int:
        """How many trials the search runs in all, its reference trials and finalists included."""
        return int(self.spec.total_trials + self.spec.finalists.trials)

    @property
    def trials(self) -> pd.DataFrame:
        """One row per ended trial: its parameters, metrics, MLflow run (``run_id``) and ``status``.

        The status is finished, pruned or failed. A running search's trials come from its Optuna study.
        """
        if self.table is not None:
            table = self.table
        elif (self.directory / "trials.csv").is_file():
            from vitplast_tune.records.table import read_trials

            table = read_trials(self.directory)
        else:
            from vitplast_tune.records.study import study_table, trial_count

            if trial_count(self.directory / STUDY_FILE, self.name) is None:  # a starting driver may be making it
                return pd.DataFrame()
            return study_table(self.study, self.settings.max_steps)
        return table.assign(status=[_trial_status(row) for _, row in table.iterrows()])

    @property
    def search_trials(self) -> pd.DataFrame:
        """The trials of the search itself, without its finalists."""
        from vitplast_tune.records.table import search_trials

        return search_trials(self.trials)

    @property
    def study(self) -> optuna.Study:
        """The search's Optuna study in its own file (``optuna.db``), the one ``optuna-dashboard`` opens.

        Raises UserError, and makes no file, where the study is not there.
        """
        import optuna

        from vitplast_tune.records.study import storage_url, trial_count

        if trial_count(self.directory / STUDY_FILE, self.name) is None:  # Optuna's opening would make an empty one
            raise UserError(
                f'search "{self.name}" has no Optuna study in {self.directory / STUDY_FILE} (missing, unreadable, '
                "or not made yet): restore the file, or let the search start its trials"
            )
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return optuna.load_study(study_name=self.name, storage=storage_url(self.directory))

    def runs(self) -> pd.DataFrame:
        """Read the search's trial runs from its MLflow store, as ``mlflow.search_runs`` gives them.

        Returns:
            One row per trial run, with MLflow's columns (``run_id``, ``params.*``, ``metrics.*``, ``tags.*``).

        Raises:
            UserError: The search's SQLite store is not there. A read never makes one.
        """
        import mlflow
        from mlflow.tracking import MlflowClient

        from vitplast_tune.records.tracking import sqlite_file

        store = sqlite_file(self.place.tracking_uri)
        if store is not None and not store.is_file():
            raise UserError(
                f'the MLflow store {store} of search "{self.name}" is not there; restore it, or pass the tracking URI '
                "it moved to (tracking_uri=)"
            )
        experiment = MlflowClient(self.place.tracking_uri).get_experiment_by_name(self.place.experiment)
        if experiment is None:
            return pd.DataFrame()
        previous = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(self.place.tracking_uri)
        try:
            return mlflow.search_runs(
                [experiment.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{self.parent_run_id}'"
            )
        finally:
            mlflow.set_tracking_uri(previous)

    @property
    def best_trial(self) -> pd.Series | None:
        """The trial that stands for the answer, whose weights ``best_model`` loads; None before any trial ended.

        With finalists, it is the chosen configuration's best seed, else the trial of the best validation metric.
        """
        from vitplast_tune.records.finalists import answer_trial

        top = answer_trial(self.trials, self.spec)
        return None if top.empty else top.iloc[0]

    def best_model(self, device: str = "cpu") -> nn.Module:
        """Load the best trial's timm model with its best-validation weights, in eval mode.

        Args:
            device: Where to put it.

        Returns:
            The model. The search must have finished.
        """
        from vitplast_tune.vit.best_model import load_best_model

        return load_best_model(self.name, self.place.storage, self.place.tracking_uri, device=device)

    @property
    def answer(self) -> Answer | FinalAnswer | None:
        """The numbers behind the summary's first line; None before any trial reported a validation accuracy."""
        from vitplast_tune.records.answer import answer_of

        return answer_of(self.trials)

    def summary(self, k: int = TOP_TRIALS) -> str:
        """Return the text the search printed at its end, or make it again from its records.

        Args:
            k: How many top trials to show.

        Returns:
            The kept text of a finished search for the default ``k``, else a text made from the records.
        """
        kept = kept_summary(self.directory) if k == TOP_TRIALS and self.status == "finished" else None
        if kept is not None:
            return kept
        filled = copy.copy(self)
        if filled.analysis is None:
            filled.analysis = self._recorded_analysis()
        if not filled.elapsed_s:
            filled.elapsed_s = _recorded_elapsed_s(self._parent_run()) or 0.0
        return summary(filled, k)

    def pareto(self) -> dict[str, pd.DataFrame]:
        """Find the Pareto fronts of the full-budget trials, one per cost.

        Returns:
            The cost's column (``trainable_params``, ``images_per_s``) -> the trials on its front.
        """
        from vitplast_tune.records.pareto import PARETO_AXES, pareto_front

        trials = self.trials
        return {cost: pareto_front(trials, cost, better) for cost, better, _ in PARETO_AXES if cost in trials}

    def correlation(self) -> pd.DataFrame:
        """Tell how well each plasticity score, and the parameter count, ranked the trials.

        The recorded analysis answers; without one, it is computed from the trials that have ended.

        Returns:
            One row per score and target: Spearman, its interval, the difference with the baseline and the verdict.
        """
        import tempfile

        from vitplast_tune.analysis.prediction import analyze_trials, read_correlations

        path = self.directory / "analysis" / "correlations.csv"
        if path.is_file():
            return read_correlations(path)
        trials = self.trials
        if trials.empty or "plasticity_mean" not in trials:
            return pd.DataFrame()
        with tempfile.TemporaryDirectory(prefix="vitplast-correlation-") as tmp:
            return analyze_trials(trials, tmp).correlations

    def _recorded_analysis(self) -> SearchAnalysis | None:
        """Read the recorded per-trial analysis for the summary; None when none is recorded."""
        from vitplast_tune.analysis.analyze import SearchAnalysis
        from vitplast_tune.analysis.prediction import TrialAnalysis, read_correlations

        folder = self.directory / "analysis"
        if not (folder / "correlations.csv").is_file():
            return None
        single = folder / "single_components.csv"
        singles = pd.read_csv(single) if single.is_file() and single.stat().st_size > 1 else pd.DataFrame()
        finished = sum(self.trials["status"] == "finished")
        return SearchAnalysis(
            trials=TrialAnalysis(read_correlations(folder / "correlations.csv"), singles, [], finished)
        )

    def describe(self) -> dict[str, Any]:
        """Say where the search stands and where its records lie, as plain values (``vitplast status --json``).

        Returns:
            ``name``, ``status``, the trial counts (``trials``, ``ended``, ``finished``, ``pruned``, ``failed``,
            ``left``), ``best`` (the best trial's subset, rate and accuracies), ``answer`` (the summary's first
            line), ``elapsed_s``, and where the records lie: ``directory``, ``storage``, ``tracking_uri``,
            ``experiment``, ``experiment_id``, ``parent_run_id``, ``study_url`` and ``study_name``. A value not known
            yet is None.
        """
        trials, best = self.trials, self.best_trial
        counts = trials["status"].value_counts().to_dict() if "status" in trials else {}
        said = None
        if best is not None:
            said = {k: _plain(best.get(k)) for k in ("components", "lr", "best_val_acc", "test_acc") if k in best}
        parent = self._parent_run()
        study = self.directory / STUDY_FILE
        return {
            "name": self.name,
            "status": self.status,
            "trials": self.total_trials,
            "ended": len(trials),
            **{state: int(counts.get(state, 0)) for state in STATUSES},
            "left": max(0, self.total_trials - len(trials)),
            "best": said,
            "answer": str(answer) if (answer := self.answer) is not None else None,
            "elapsed_s": _elapsed_s(parent),
            "directory": str(self.directory),
            "storage": str(self.place.storage),
            "tracking_uri": self.place.tracking_uri,
            "experiment": self.place.experiment,
            "experiment_id": parent.info.experiment_id if parent is not None else None,
            "parent_run_id": self.record.get("parent_run_id"),
            "study_url": f"sqlite:///{study}" if study.is_file() else None,
            "study_name": self.name if study.is_file() else None,
        }

    def _parent_run(self):
        """Read the search's MLflow parent run; None when the tracking store does not answer."""
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        from vitplast_tune.records.tracking import bounded_calls, sqlite_file

        store = sqlite_file(self.place.tracking_uri)
        if store is not None and not store.is_file():  # gone: a read never makes it anew
            return None
        try:
            with bounded_calls(retries=0, timeout_s=5):  # a server that is down: noticed in seconds
                return MlflowClient(self.place.tracking_uri).get_run(self.parent_run_id)
        except (MlflowException, OSError):
            return None

    def __repr__(self) -> str:
        said = f"{len(self.trials)}/{self.total_trials} trials"
        best = self.best_trial
        accuracy = None if best is None else best.get("best_val_acc")
        if best is not None and isinstance(accuracy, float) and accuracy == accuracy:  # a number, not NaN
            said += f", best {best['components']} {100 * accuracy:.2f}%"
        return f"Search({self.name!r}, {self.status}, {said})"


def _recorded_elapsed_s(parent) -> float | None:
    """Read the wall time the search's driver recorded at its end; None while it runs."""
    from vitplast_tune.records.tracking import ELAPSED_METRIC

    return parent.data.metrics.get(ELAPSED_METRIC) if parent is not None else None


def _elapsed_s(parent) -> float | None:
    """Return the search's wall time in seconds: the recorded one, else since its parent run started; None without it."""
    import time

    if parent is None:
        return None
    if (recorded := _recorded_elapsed_s(parent)) is not None:
        return round(recorded, 1)
    info = parent.info
    end = info.end_time if info.status != "RUNNING" and info.end_time else time.time() * 1000
    return round((end - info.start_time) / 1000, 1)


def _trial_status(row: pd.Series) -> str:
    """Say whether a trial finished, was pruned or failed, as its Optuna trial does."""
    if bool(row.get("diverged")) or isinstance(row.get("error"), str):
        return "failed"
    if bool(row.get("over_budget")) or not (row.get("step", 0) or 0) >= (row.get("max_steps", 0) or 0):
        return "pruned"
    return "finished"


def _plain(value: Any) -> Any:
    """Turn a table's value into what JSON takes: numpy scalars as Python's, NaN as None."""
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and value != value else value
