"""A finished search analyzed again from its stored trial table, and the paper's cross-dataset table of several."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from vitplast_tune._compat import mlflow as mlflow_internals
from vitplast_tune.analysis import protocol
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.plan.options import EXPERIMENT
from vitplast_tune.records import tracking
from vitplast_tune.records.result import SearchResult
from vitplast_tune.records.table import read_trials
from vitplast_tune.space.files import load_space
from vitplast_tune.storage import SearchPlace, default_storage, read_record


def reanalyze(
    name: str, storage: str | None = None, tracking_uri: str | None = None, criteria: bool = False
) -> SearchResult:
    """Analyze a finished search again from its stored trial table and log to its parent run (``criteria``: also the lab)."""
    directory = Path(storage or default_storage()).expanduser() / name
    record, table = read_record(directory, purpose="recorded"), read_trials(directory)
    spec = load_space(record["space_path"])
    spec = dataclasses.replace(spec, criteria=spec.criteria or criteria)
    uri = tracking_uri or record["tracking_uri"]
    place = SearchPlace(
        name, str(directory.parent), uri, record.get("experiment", EXPERIMENT), record.get("search_id", "")
    )
    result = SearchResult(place, spec, FinetuneConfig.from_dict(record["settings"]), table, record["parent_run_id"])
    from vitplast_tune.run import driver  # Ray Tune: imported by the jobs that run or record a search

    with mlflow_internals.no_artifact_progress_bar():
        driver.analyze(result, tracking.client(uri))
    return result


def compare_datasets(names: Sequence[str], storage: str | None = None, out_dir: str | None = None) -> str:
    """The paper's cross-dataset table of several finished searches (one per dataset), written to ``out_dir``; as text."""
    root = Path(storage or default_storage()).expanduser()
    found = {name: read_trials(root / name) for name in names}
    out = Path(out_dir).expanduser() if out_dir else root / f"cross-{'-'.join(names)}"
    gains, agreement, _ = protocol.cross_dataset_report(found, out)
    return protocol.describe_cross_dataset(gains, agreement) + f"\nfiles: {out}"
