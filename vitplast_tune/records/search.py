"""A search read back from its records, without Ray: ``load_search(name)`` gives a ``Search`` whose trials are a
DataFrame, whose study is the Optuna study on the search's own storage, whose runs are its MLflow runs, and whose
best model, answer, summary, Pareto fronts and correlations are a call away, on a finished search and on one that
still runs (what has ended so far); ``list_searches`` names the searches a storage holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from vitplast_tune.errors import SearchNotFound, UserError
from vitplast_tune.lock import running_owner
from vitplast_tune.storage import SEARCH_FILE, STUDY_FILE, SearchPlace, default_storage, read_record
from vitplast_tune.typed import checked

if TYPE_CHECKING:  # torch only in annotations: loading a search's records imports no torch
    from torch import nn

STATUSES = ("finished", "pruned", "failed")  # a trial's status in ``Search.trials`` (Optuna: COMPLETE, PRUNED, FAIL)
_STATES = {"COMPLETE": "finished", "PRUNED": "pruned", "FAIL": "failed"}


@checked()
def list_searches(storage: str | Path | None = None) -> list[str]:
    """The names of the searches recorded in a storage folder, sorted.

    Args:
        storage: the storage root (default: ``$VITPLAST_RESULTS_DIR``, else ``~/vitplast_tune_results``).

    Returns:
        Each folder name under ``storage`` that holds a search record.
    """
    root = Path(storage or default_storage()).expanduser()
    if not root.is_dir():
        return []
    return sorted(p.parent.name for p in root.glob(f"*/{SEARCH_FILE}"))


@checked()
def load_search(name: str, storage: str | Path | None = None, tracking_uri: str | None = None) -> Search:
    """A recorded search read back (no Ray started), finished or still running.

    Args:
        name: the search's name (``--name``).
        storage: its storage root (default: ``$VITPLAST_RESULTS_DIR``, else ``~/vitplast_tune_results``).
        tracking_uri: its MLflow tracking URI, when the store moved (default: the one the search recorded to).

    Returns:
        The ``Search``.

    Raises:
        SearchNotFound: no search of that name in ``storage``; the message lists the known ones.
    """
    root = Path(storage or default_storage()).expanduser().resolve()
    if not (root / name / SEARCH_FILE).is_file():
        known = list_searches(root)
        listed = f"known: {', '.join(known)}" if known else "it holds none"
        raise SearchNotFound(f'no search "{name}" in {root} ({listed}); check the name and the storage')
    record = read_record(root / name, purpose="recorded")
    place = SearchPlace(
        name,
        str(root),
        tracking_uri or record["tracking_uri"],
        record.get("experiment", "vitplast_tune"),
        record.get("search_id", ""),
    )
    return Search(place, record)


@dataclass
class Search:
    """A search as its records hold it: a finished one whole, a running one as far as its trials have ended.

    Attributes:
        place: Its name, storage, MLflow tracking URI and experiment.
        record: Its record (``storage.SEARCH_FILE``), as the driver wrote it.
    """

    place: SearchPlace
    record: dict[str, Any] = field(repr=False)

    @property
    def name(self) -> str:
        """The search's name."""
        return self.place.name

    @property
    def directory(self) -> Path:
        """The search's folder in its storage."""
        return Path(self.place.storage) / self.place.name

    @property
    def status(self) -> str:
        """``running`` (its driver holds the lock), ``finished`` (its trial table is written) or ``stopped``
        (interrupted: ``vitplast search --name NAME --resume`` continues it)."""
        if running_owner(self.directory) is not None:
            return "running"
        return "finished" if (self.directory / "trials.csv").is_file() else "stopped"

    @cached_property
    def spec(self):
        """The search's space (``SearchSpec``), read from the file it recorded, with the trial count, budgets,
        finalists stage and reference trials the search ran (``num_samples=``, ``budgets=`` and the finalists' flags
        override the file's; a search recorded before the stage or the reference trials existed has none)."""
        from dataclasses import replace

        from vitplast_tune.space.files import load_space
        from vitplast_tune.space.finalists import Finalists

        budgets = self.record.get("budgets")
        spec = load_space(self.record["space_path"]).with_overrides(
            num_samples=self.record.get("num_samples"), budgets=tuple(budgets) if budgets else None
        )
        return replace(
            spec, finalists=Finalists(**self.record.get("finalists", {})), baselines=self.record.get("baselines", 0)
        )

    @property
    def settings(self):
        """What every trial did before its sampled parameters (a ``FinetuneConfig``)."""
        from vitplast_tune.config import FinetuneConfig

        return FinetuneConfig.from_dict(self.record["settings"])

    @property
    def total_trials(self) -> int:
        """How many trials the search runs in all (its reference trials, and its finalists stage's at most)."""
        return int(self.spec.total_trials + self.spec.finalists.trials)

    @property
    def trials(self) -> pd.DataFrame:
        """One row per trial that has ended: its subset, every searched parameter, ``status`` (finished, pruned,
        failed), its final metrics, plasticity scores and MLflow run id (``run_id``); read anew at each call."""
        path = self.directory / "trials.csv"
        if path.is_file():
            from vitplast_tune.records.table import read_trials

            table = read_trials(self.directory)  # a damaged table: UserError saying which file and what to do
            return table.assign(status=table.apply(_trial_status, axis=1))
        from vitplast_tune.records.study import study_made

        if not study_made(self.directory / STUDY_FILE, self.name):  # a starting driver may be making it
            return pd.DataFrame()
        return _study_table(self.study, self.settings.max_steps)

    @property
    def study(self):
        """The search's Optuna study on its own storage (``optuna.db`` in its folder), the one ``optuna-dashboard``
        opens: not a copy; UserError, and no file made, where the study is not there."""
        import optuna

        from vitplast_tune.records.study import storage_url, study_made

        if not study_made(self.directory / STUDY_FILE, self.name):  # Optuna's own opening would make an empty one
            raise UserError(
                f'search "{self.name}" has no Optuna study in {self.directory / STUDY_FILE} (missing, unreadable, '
                "or not made yet): restore the file, or let the search start its trials"
            )
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return optuna.load_study(study_name=self.name, storage=storage_url(self.directory))

    def runs(self) -> pd.DataFrame:
        """Read the search's MLflow runs (its trials' child runs) from its own tracking URI.

        They come as ``mlflow.search_runs`` gives them.

        Returns:
            One row per trial run, MLflow's columns (``run_id``, ``params.*``, ``metrics.*``, ``tags.*``).

        Raises:
            UserError: The search's SQLite store is not there (a read never makes one).
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
        client = MlflowClient(self.place.tracking_uri)
        experiment = client.get_experiment_by_name(self.place.experiment)
        if experiment is None:
            return pd.DataFrame()
        parent = self.record["parent_run_id"]
        previous = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(self.place.tracking_uri)
        try:
            return mlflow.search_runs(
                experiment_ids=[experiment.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
            )
        finally:
            mlflow.set_tracking_uri(previous)

    @property
    def best_trial(self) -> pd.Series | None:
        """The trial that stands for the answer, whose weights ``best_model`` loads (the row of ``trials``): the
        finalists' chosen configuration's best seed, else the trial of the best validation metric
        (``records.finalists.answer_trial``); None before any trial ended."""
        from vitplast_tune.records.finalists import answer_trial

        top = answer_trial(self.trials, self.spec)
        return None if top.empty else top.iloc[0]

    def best_model(self, device: str = "cpu") -> nn.Module:
        """Load the best trial's timm model with its best-validation weights, in eval mode.

        The search must have finished.

        Args:
            device: where to put it.

        Returns:
            The ``torch.nn.Module``.
        """
        from vitplast_tune.vit.best_model import load_best_model

        return load_best_model(self.name, self.place.storage, self.place.tracking_uri, device=device)

    @property
    def answer(self):
        """The numbers behind the answer the summary opens with (``records.answer.Answer``; printed, its line
        ``Answer: finetune ...``), or None before any trial reported a validation accuracy."""
        from vitplast_tune.records.answer import answer_of

        return answer_of(self.trials)

    def summary(self, k: int = 10) -> str:
        """Summarize the search as the text it prints at its end.

        The answer, the top ``k`` trials, the Pareto fronts, the analysis recorded, and where everything lies. A
        finished search gives the very text its command printed (``summary.txt`` in its folder, timings and links
        included) for the ``k`` printed; otherwise the text is made again from its records, with the wall time its
        driver recorded.

        Args:
            k: how many of the top trials to show.

        Returns:
            The summary, lines joined.
        """
        from vitplast_tune.records.result import TOP_TRIALS, SearchResult, kept_summary, summary

        kept = kept_summary(self.place.results_dir) if k == TOP_TRIALS and self.status == "finished" else None
        if kept is not None:
            return kept
        result = SearchResult(self.place, self.spec, self.settings, self.trials, self.record["parent_run_id"])
        result.analysis, result.elapsed_s = self._analysis(), _recorded_elapsed_s(self._parent_run()) or 0.0
        return summary(result, k)

    def pareto(self) -> dict[str, pd.DataFrame]:
        """The Pareto fronts of the full-budget trials, one per cost.

        Returns:
            The cost's column (``trainable_params``, ``images_per_s``) -> the trials on its front.
        """
        from vitplast_tune.records.pareto import PARETO_AXES, pareto_front

        trials = self.trials
        return {cost: pareto_front(trials, cost, better) for cost, better, _ in PARETO_AXES if cost in trials}

    def correlation(self) -> pd.DataFrame:
        """Tell how well each plasticity score, and the parameter count, ranked the trials.

        The analysis the search recorded (``analysis/correlations.csv``), else computed now from the trials that have
        ended.

        Returns:
            One row per score and target: Spearman, its interval, the difference with the baseline and the verdict.
        """
        from vitplast_tune.analysis.prediction import analyze_trials, read_correlations

        path = self.place.results_dir / "analysis" / "correlations.csv"
        if path.is_file():
            return read_correlations(path)
        import tempfile

        trials = self.trials
        if trials.empty or "plasticity_mean" not in trials:
            return pd.DataFrame()
        with tempfile.TemporaryDirectory(prefix="vitplast-correlation-") as tmp:
            return analyze_trials(trials, tmp).correlations

    def _analysis(self):
        """The recorded per-trial analysis as a ``SearchAnalysis`` for the summary (None when none is recorded)."""
        from vitplast_tune.analysis.analyze import SearchAnalysis
        from vitplast_tune.analysis.prediction import TrialAnalysis, read_correlations

        folder = self.place.results_dir / "analysis"
        if not (folder / "correlations.csv").is_file():
            return None
        single = folder / "single_components.csv"
        singles = pd.read_csv(single) if single.is_file() and single.stat().st_size > 1 else pd.DataFrame()
        table = read_correlations(folder / "correlations.csv")
        finished = sum(self.trials["status"] == "finished")
        return SearchAnalysis(trials=TrialAnalysis(table, singles, [], finished))

    def describe(self) -> dict[str, Any]:
        """Where the search stands and where its records lie, as plain values (``vitplast status NAME --json``).

        Returns:
            ``name``, ``status`` (finished, running, stopped), ``trials`` (in all), ``ended``, ``finished``,
            ``pruned``, ``failed``, ``left`` (trials not ended yet), ``best`` (the best trial's subset, learning rate
            and validation accuracy, or None), ``answer`` (the summary's answer line, or None), ``elapsed_s`` (the
            driver's wall time as its summary said it, else since its MLflow parent run started), and where the
            records lie: ``directory``, ``storage``, ``tracking_uri``, ``experiment``, ``experiment_id`` and
            ``parent_run_id`` (MLflow), ``study_url`` and ``study_name`` (Optuna; None before the study is made).
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
        """The search's MLflow parent run, or None when the tracking store does not answer."""
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        from vitplast_tune.records.tracking import bounded_calls, sqlite_file

        store = sqlite_file(self.place.tracking_uri)
        if store is not None and not store.is_file():  # gone: never made anew by a read
            return None
        try:
            with bounded_calls(retries=0, timeout_s=5):  # a server that is down: noticed in seconds, not minutes
                return MlflowClient(self.place.tracking_uri).get_run(self.record["parent_run_id"])
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
    """The wall time a search's driver recorded at its end (``ELAPSED_METRIC``), or None (running, or recorded
    before)."""
    from vitplast_tune.records.tracking import ELAPSED_METRIC

    return parent.data.metrics.get(ELAPSED_METRIC) if parent is not None else None


def _elapsed_s(parent) -> float | None:
    """A search's wall time in seconds: what its driver recorded at its end (``ELAPSED_METRIC``, the summary's "in N
    min"), else since its MLflow parent run started, until it ended (a running or stopped search); None without the
    run."""
    import time

    if parent is None:
        return None
    if (recorded := _recorded_elapsed_s(parent)) is not None:
        return round(recorded, 1)
    info = parent.info
    end = info.end_time if info.status != "RUNNING" and info.end_time else time.time() * 1000
    return round((end - info.start_time) / 1000, 1)


def _trial_status(row: pd.Series) -> str:
    """A row of the trial table as finished, pruned or failed, as its Optuna trial is (``records.study``)."""
    if bool(row.get("diverged")) or isinstance(row.get("error"), str):
        return "failed"
    if bool(row.get("over_budget")) or not (row.get("step", 0) or 0) >= (row.get("max_steps", 0) or 0):
        return "pruned"
    return "finished"


def _study_table(study, max_steps: int) -> pd.DataFrame:
    """The trials a running search's study holds, one row each: the trial table's columns that the study keeps
    (its parameters, subset, accuracies, step, parameters trained, MLflow run), ``max_steps`` where it samples none,
    and a failed trial's ``error`` pointing at its run."""
    from vitplast_tune.components import COMPONENT_FLAGS
    from vitplast_tune.records.study import TRIAL_ATTR

    rows = []
    for t in study.get_trials(deepcopy=False):
        attrs = dict(t.user_attrs)
        params = {k: _loaded(v) for k, v in t.params.items() if k not in COMPONENT_FLAGS}
        status = _STATES.get(t.state.name, "running")
        rows.append(
            {
                "trial_id": attrs.pop(TRIAL_ATTR, None),
                **params,
                **attrs,
                "max_steps": params.get("max_steps", max_steps),
                "diverged": False,
                "error": "failed: see its MLflow run" if status == "failed" else None,
                "status": status,
            }
        )
    table = pd.DataFrame(rows)
    for column in ("best_val_acc", "test_acc", "step", "trainable_params"):
        if column not in table:
            table[column] = float("nan")
    return table


def _plain(value: Any) -> Any:
    """A table's value as JSON takes it (numpy scalars as Python's, NaN as None)."""
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and value != value else value


def _loaded(value: Any) -> Any:
    """A choice as the study stores it, back (JSON text for lists and mappings)."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
