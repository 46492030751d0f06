"""Keep a search's sampled trials as an Optuna study in ``optuna.db`` beside its results (docs/architecture.md)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from vitplast_tune.components import COMPONENT_FLAGS, component_flags
from vitplast_tune.records.table import sampled_trials
from vitplast_tune.space import distributions as dist
from vitplast_tune.space.files import SearchSpec
from vitplast_tune.storage import STUDY_FILE, spoken

TRIAL_ATTR = "ray_trial_id"  # the user attribute that ties an Optuna trial to its Ray Tune trial
_STATES = {"COMPLETE": "finished", "PRUNED": "pruned", "FAIL": "failed"}  # as ``Search.trials`` says
USER_ATTRS = ("components", "best_val_acc", "test_acc", "step", "trainable_params", "run_id")


def storage_url(directory: Path) -> str:
    """Return the SQLite URL of the study file in a search's directory."""
    return f"sqlite:///{Path(directory).resolve() / STUDY_FILE}"


def study_parameters(spec: SearchSpec) -> dict[str, Any]:
    """List the study's parameters and their Optuna distributions: the component flags, then the others searched."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    found: dict[str, Any] = {}
    for name, p in spec.parameters.items():
        if isinstance(p, dist.Constant):
            continue
        if name == "components":
            found.update({flag: CategoricalDistribution([False, True]) for flag in COMPONENT_FLAGS})
        elif isinstance(p, dist.Choice):
            found[name] = CategoricalDistribution([_categorical(v) for v in p.values])
        elif isinstance(p, dist.RandInt):
            found[name] = IntDistribution(p.low, p.high)
        elif isinstance(p, dist.Uniform):
            found[name] = FloatDistribution(p.low, p.high, log=isinstance(p, dist.LogUniform))
    return found


def parameter_table(trials: pd.DataFrame, spec: SearchSpec) -> pd.DataFrame:
    """Tabulate each trial's study parameters, one column each, rows as in ``trials``."""
    columns: dict[str, Any] = {}
    for name in study_parameters(spec):
        if name in COMPONENT_FLAGS:
            flags = trials["components"].map(component_flags)
            columns[name] = flags.map(lambda f, n=name: f[n]).astype(bool)
        elif name in trials:
            columns[name] = trials[name].map(_categorical) if trials[name].dtype == object else trials[name]
    return pd.DataFrame(columns, index=trials.index)


def frozen_trials(trials: pd.DataFrame, spec: SearchSpec, curves: dict[str, dict[str, dict[int, float]]]) -> list:
    """Make one Optuna ``FrozenTrial`` per row; ``curves`` maps trial id -> metric -> {step: value}."""
    from optuna.trial import create_trial

    distributions = study_parameters(spec)
    params = parameter_table(trials, spec)
    objectives = [m for m, _ in spec.objectives] or [spec.metric]
    made = []
    for (_, row), (_, values) in zip(trials.iterrows(), params.iterrows()):
        curve = curves.get(str(row["trial_id"]), {})
        state, finals = _state_and_values(row, [_last(curve.get(m)) for m in objectives])
        steps = {} if len(objectives) > 1 else {s: v for s, v in (curve.get(spec.metric) or {}).items() if _finite(v)}
        trial = create_trial(
            state=state,
            values=finals,
            params={k: _plain(v) for k, v in values.items()},
            distributions=distributions,
            user_attrs={TRIAL_ATTR: str(row["trial_id"]), **_user_attrs(row)},
            intermediate_values=steps,
        )
        if _finite(row.get("started_at")) and _finite(row.get("ended_at")):  # else Optuna's: now, a duration of 0
            trial.datetime_start = datetime.fromtimestamp(row["started_at"])
            trial.datetime_complete = datetime.fromtimestamp(row["ended_at"])
        made.append(trial)
    return made


def open_study(directory: Path, name: str, spec: SearchSpec):
    """Open the study ``name`` in ``directory/optuna.db``, making it when missing."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    Path(directory).mkdir(parents=True, exist_ok=True)
    directions = ["maximize" if mode == "max" else "minimize" for _, mode in spec.objectives or [(None, spec.mode)]]
    if not (Path(directory) / STUDY_FILE).exists():
        _make_whole(Path(directory), name, directions, spec)
    study = optuna.create_study(  # the tables exist: this opens the study or adds it
        storage=storage_url(directory), study_name=name, directions=directions, load_if_exists=True
    )
    _label(study, spec)
    return study


def _make_whole(directory: Path, name: str, directions: list[str], spec: SearchSpec) -> None:
    """Make ``optuna.db`` aside, then link it into place, so that a reader never races Optuna to make its tables.

    A file another process made first stays.
    """
    import optuna

    aside = directory / f".{STUDY_FILE}.{os.getpid()}.making"
    aside.unlink(missing_ok=True)
    storage = optuna.storages.RDBStorage(f"sqlite:///{aside.resolve()}")
    try:
        _label(optuna.create_study(storage=storage, study_name=name, directions=directions), spec)
    finally:
        storage.engine.dispose()
    final = directory / STUDY_FILE
    try:
        os.link(aside, final)  # never over a file another process linked first
    except FileExistsError:
        pass
    except OSError:  # a filesystem without hard links
        if not final.exists():
            os.replace(aside, final)
    finally:
        aside.unlink(missing_ok=True)


def _label(study, spec: SearchSpec) -> None:
    """Put the space's name, algorithm and metric in the study's user attributes."""
    for key, value in (("space", spec.name), ("algorithm", spec.algorithm), ("metric", spec.metric)):
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)


def known_trials(study) -> set[str]:
    """Return the Ray trial ids of the trials a study holds."""
    return {t.user_attrs.get(TRIAL_ATTR) for t in study.get_trials(deepcopy=False)}


def write_study(
    directory: Path, name: str, spec: SearchSpec, trials: pd.DataFrame, curves: dict[str, dict[str, dict[int, float]]]
) -> int:
    """Add the sampled trials the study ``name`` in ``directory/optuna.db`` lacks, making the study when missing.

    Reference trials and finalists are left out: the study holds the trials the sampler drew.

    Args:
        directory: The search's directory.
        name: The study's name.
        spec: The search's space (the study's parameters and objectives).
        trials: The trial table.
        curves: Each trial's curves: trial id -> metric -> {step: value}.

    Returns:
        How many trials this write added.
    """
    study = open_study(directory, name, spec)
    trials = sampled_trials(trials)  # the reference trials and the finalists are no trials of the search's sampler
    new = trials[~trials["trial_id"].astype(str).isin(known_trials(study))]
    study.add_trials(frozen_trials(new, spec, curves))
    return len(new)


def _state_and_values(row: pd.Series, finals: list[float | None]):
    """Give a trial's Optuna state and values: FAIL, PRUNED (stopped before its budget) or COMPLETE."""
    from optuna.trial import TrialState

    failed = bool(row.get("diverged")) or isinstance(row.get("error"), str)
    finite = all(_finite(v) for v in finals)
    if failed:
        return TrialState.FAIL, None
    if bool(row.get("over_budget")) or not (row.get("step", 0) or 0) >= (row.get("max_steps", 0) or 0):
        return TrialState.PRUNED, finals if finite else None
    return (TrialState.COMPLETE, finals) if finite else (TrialState.FAIL, None)


def _user_attrs(row: pd.Series) -> dict[str, Any]:
    attrs = {}
    for key in USER_ATTRS:
        value = row.get(key)
        if isinstance(value, str) or _finite(value):
            attrs[key] = _plain(value)
    return attrs


def _last(curve: dict[int, float] | None) -> float | None:
    return curve[max(curve)] if curve else None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _plain(value: Any) -> Any:
    """numpy scalars as Python values (Optuna stores JSON)."""
    return value.item() if hasattr(value, "item") else value


def _categorical(value: Any) -> Any:
    """A choice as Optuna stores it: None, bool, int, float and str as they are, anything else as JSON text."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value)


def trial_count(path: Path, name: str) -> int | None:
    """Count the trials of the study ``name`` in the file ``path``; None while the study is not there.

    The look is read-only: Optuna's own opening would make missing tables and race a starting driver.
    """
    if not path.is_file():
        return None
    query = (
        "SELECT COUNT(t.trial_id) FROM studies s LEFT JOIN trials t ON t.study_id = s.study_id WHERE s.study_name = ?"
    )
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as db:
            found = db.execute(query + " GROUP BY s.study_id", (name,)).fetchone()
    except sqlite3.Error:  # no tables yet, or the file being written
        return None
    return None if found is None else int(found[0])


def describe_study(directory: Path, name: str) -> str | None:
    """Write the summary's line on a search's study: how to open it and how many trials it holds; None without it."""
    count = trial_count(Path(directory) / STUDY_FILE, name)
    if count is None:
        return None
    return f"Optuna study:       optuna-dashboard {spoken(storage_url(directory))}   (study '{name}', {count} trials)"


def study_table(study, max_steps: int) -> pd.DataFrame:
    """Turn the trials a running search's study holds into trial table rows, with their ``status``."""
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


def _loaded(value: Any) -> Any:
    """Turn a choice as the study stores it back into its value (JSON text for lists and mappings)."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
