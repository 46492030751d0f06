"""Analyze a finished search again, or build the paper's cross-dataset table of several."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from vitplast_tune._compat import mlflow as mlflow_internals
from vitplast_tune.analysis import protocol
from vitplast_tune.plan.options import EXPERIMENT
from vitplast_tune.records import tracking
from vitplast_tune.records.printed import forget_summary
from vitplast_tune.records.search import Search
from vitplast_tune.records.table import read_trials
from vitplast_tune.space.files import load_space
from vitplast_tune.storage import SearchPlace, default_storage, read_record


def reanalyze(name: str, storage: str | None = None, tracking_uri: str | None = None, criteria: bool = False) -> Search:
    """Analyze a finished search again from its trial table and log the analysis to its parent run.

    Args:
        name: The search's name.
        storage: The storage holding the search, or None for the default.
        tracking_uri: The MLflow store, or None for the one the search used.
        criteria: Whether to run the criteria lab's analysis even if the space does not ask for it.

    Returns:
        The analyzed result.

    Raises:
        UserError: If the search's record or trial table is missing.
    """
    directory = Path(storage or default_storage()).expanduser() / name
    record, table = read_record(directory, purpose="recorded"), read_trials(directory)
    spec = load_space(record["space_path"])
    spec = dataclasses.replace(spec, criteria=spec.criteria or criteria)
    uri = tracking_uri or record["tracking_uri"]
    place = SearchPlace(
        name, str(directory.parent), uri, record.get("experiment", EXPERIMENT), record.get("search_id", "")
    )
    result = Search(place, record, table)
    result.spec = spec
    from vitplast_tune.run import driver  # it imports Ray Tune

    with mlflow_internals.no_artifact_progress_bar():
        driver.analyze(result, tracking.client(uri))
    forget_summary(result.place.results_dir)  # the kept summary is stale; vitplast analyze keeps the new one
    return result


def compare_datasets(names: Sequence[str], storage: str | None = None, out_dir: str | None = None) -> str:
    """Build the paper's cross-dataset table of several finished searches, one per dataset, and write its files.

    Args:
        names: The searches' names.
        storage: The storage holding them, or None for the default.
        out_dir: Where the files go, or None for ``cross-<names>`` in the storage.

    Returns:
        The table as text, with the folder of its files.
    """
    gains, agreement, out = cross_dataset(names, storage, out_dir)
    return protocol.describe_cross_dataset(gains, agreement) + f"\nfiles: {out}"


def cross_dataset(
    names: Sequence[str], storage: str | None = None, out_dir: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    """Build the cross-dataset tables of several finished searches and write their files.

    Args:
        names: The searches' names.
        storage: The storage holding them, or None for the default.
        out_dir: Where the files go, or None for ``cross-<names>`` in the storage.

    Returns:
        The relative gains, the rank agreement per dataset, and the files' folder.
    """
    root = Path(storage or default_storage()).expanduser()
    found = {name: read_trials(root / name) for name in names}
    out = Path(out_dir).expanduser() if out_dir else root / f"cross-{'-'.join(names)}"
    gains, agreement, _ = protocol.cross_dataset_report(found, out)
    return gains, agreement, out
