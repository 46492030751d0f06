"""Where a search's results live: the storage root (a local or shared path, or a URI such as s3://), the record a
search writes there (``vitplast_search.json``) that ``--resume``, ``analyze``, ``recommend``, ``vitplast ui`` and
``load_best_model`` read back, and the names of the best trial's files on its MLflow runs.

A URI may carry pyarrow's filesystem options as a query (``s3://bucket/dir?endpoint_override=host:9000&scheme=http``
for an S3-compatible server): ``join`` keeps the query at the end, and ``filesystem`` opens it with pyarrow, as Ray
Tune does, so the driver reads what trials on other nodes wrote through the same store.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vitplast_tune.errors import UserError

RESULTS_ENV = "VITPLAST_RESULTS_DIR"  # overrides the default storage root


SEARCH_FILE = "vitplast_search.json"  # the record of a search in its directory
# The best trial, as a finished search leaves it on MLflow: its trained tensors and settings under BEST_TRIAL_DIR of
# the parent run (and WEIGHTS_DIR of the trial's own run), the model rebuilt with them as the parent's MLflow model.
BEST_TRIAL_DIR = "best_trial"
WEIGHTS_DIR = "weights"
WEIGHTS_FILE = "trainable_weights.safetensors"  # the trainable tensors of its best-validation weights
TRIAL_FILE = "trial.json"  # its row of the trial table, and its settings (a FinetuneConfig) under "settings"
MODEL_NAME = "best_model"  # mlflow.pytorch.load_model("runs:/<parent run>/best_model")
# A trial's checkpoint: the trainable tensors, optimizer and step; the best-validation trainable tensors beside them.
STATE_FILE = "state.pt"
BEST_FILE = "best.safetensors"
FAILURE_TAG = "failure_reason"  # on a failed MLflow run: why (records/tracking.py writes it, load_best_model reads it)
STUDY_FILE = "optuna.db"  # the search's Optuna study, a SQLite file in its directory (records/study.py)


@dataclass(frozen=True)
class SearchPlace:
    """Where a search keeps its records: its name, storage root (a path or a URI), MLflow tracking URI and experiment,
    and the unique id that tags its MLflow parent run."""

    name: str
    storage: str
    tracking_uri: str
    experiment: str
    search_id: str = ""

    @property
    def location(self) -> str:
        """Where Ray Tune keeps the search: its storage joined with its name (a path, or a URI)."""
        return join(self.storage, self.name)

    @property
    def local_dir(self) -> Path | None:
        """The search's directory when storage is a local path (None for s3:// and the like)."""
        return None if is_uri(self.storage) else Path(self.storage) / self.name

    @property
    def results_dir(self) -> Path:
        """Where the search's own files (trial table, analysis) go: its directory, else a local one."""
        return self.local_dir or default_storage() / self.name

    def in_default_storage(self) -> bool:
        """Whether the search lies in ``default_storage()`` (its commands then need no ``--storage``)."""
        return self.local_dir is not None and Path(self.storage) == default_storage().resolve()


def default_storage() -> Path:
    """Where searches are stored when ``--storage`` is not given: ``$VITPLAST_RESULTS_DIR``, else
    ``~/vitplast_tune_results``."""
    return Path(os.environ.get(RESULTS_ENV) or Path.home() / "vitplast_tune_results").expanduser()


def is_uri(path: str) -> bool:
    """Whether a storage location is a URI (s3://, gs://, ...) rather than a local path."""
    return "://" in path


def join(location: str, *parts: str) -> str:
    """``location`` extended by ``parts``: a path as a path, a URI before its query (its filesystem options)."""
    if not is_uri(location):
        return str(Path(location, *parts))
    base, mark, query = location.partition("?")
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)]) + mark + query


def filesystem(location: str):
    """The pyarrow filesystem of a storage location (a path or a URI with its query options) and the path in it."""
    import pyarrow.fs

    if not is_uri(location):
        return pyarrow.fs.LocalFileSystem(), str(Path(location).expanduser())
    return pyarrow.fs.FileSystem.from_uri(location)


def download(fs, path: str, into: Path) -> Path:
    """Copy the file ``path`` of the pyarrow filesystem ``fs`` (a checkpoint's, ``filesystem``'s) into ``into``."""
    import pyarrow.fs

    target = Path(into) / Path(path).name
    pyarrow.fs.copy_files(path, str(target), source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem())
    return target


def upload(folder: Path, location: str) -> None:
    """Copy the local ``folder``'s files into ``location`` (a path or a URI with its query options), made if missing
    (an object store has no folders to make: its keys are written directly)."""
    import pyarrow.fs

    fs, path = filesystem(location)
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        fs.create_dir(path, recursive=True)
    pyarrow.fs.copy_files(str(folder), path, source_filesystem=pyarrow.fs.LocalFileSystem(), destination_filesystem=fs)


def fetch(location: str, into: Path) -> bool:
    """Copy the files of the folder ``location`` (a path or a URI) into the local folder ``into``; False when there is
    no such folder."""
    import pyarrow.fs

    fs, path = filesystem(location)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.Directory:
        return False
    Path(into).mkdir(parents=True, exist_ok=True)
    pyarrow.fs.copy_files(path, str(into), source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem())
    return True


def remove(location: str) -> None:
    """Delete the folder ``location`` (a path or a URI) and what it holds, if it is there."""
    import pyarrow.fs

    fs, path = filesystem(location)
    if fs.get_file_info(path).type == pyarrow.fs.FileType.Directory:
        fs.delete_dir(path)


def search_dir(name: str, storage: str | Path | None = None) -> Path:
    """The directory of search ``name`` under ``storage`` (default: ``default_storage()``)."""
    return Path(storage or default_storage()).expanduser() / name


def read_record(directory: Path, purpose: str = "to resume") -> dict[str, Any]:
    """The record of the search stored in ``directory``; UserError (naming the ``purpose``) when there is none."""
    path = directory / SEARCH_FILE
    if not path.is_file():
        raise UserError(f'no search "{directory.name}" {purpose} in {directory.parent}; check its name and --storage')
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(
            f"the search record {path} is unreadable ({exc}); restore it, or start a new search with another --name"
        ) from None
    missing = [
        k for k in ("name", "space_path", "fingerprint", "tracking_uri", "parent_run_id", "settings") if k not in record
    ]
    if not isinstance(record, dict) or missing:
        raise UserError(
            f"the search record {path} is incomplete (no {', '.join(missing) or 'mapping'}); "
            "start a new search with another --name"
        )
    return record


def write_record(directory: Path, record: dict[str, Any]) -> None:
    """Write a search's record (``SEARCH_FILE``) into ``directory``, made if missing: whole or not at all (a temporary
    file renamed over the old one)."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{SEARCH_FILE}.{os.getpid()}.tmp"
    partial.write_text(json.dumps(record, indent=2, default=str))
    os.replace(partial, directory / SEARCH_FILE)


# URI schemes that pyarrow.fs.FileSystem.from_uri (what Ray Tune uses) resolves, and the pyarrow
# filesystem class each needs.
_SCHEMES = {
    "s3": "S3FileSystem",
    "gs": "GcsFileSystem",
    "gcs": "GcsFileSystem",
    "hdfs": "HadoopFileSystem",
    "viewfs": "HadoopFileSystem",
    "abfs": "AzureFileSystem",
    "abfss": "AzureFileSystem",
}


def storage_uri(storage: str) -> str:
    """``--storage`` checked: a path stays a path (``file://`` becomes one), a URI needs a filesystem pyarrow has."""
    if "://" not in storage:
        return storage
    parsed = urlparse(storage)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        return parsed.path
    if scheme not in _SCHEMES:
        raise UserError(
            f'--storage "{storage}": unknown scheme {scheme}://; use a local or shared-filesystem path, '
            f"or one of {', '.join(s + '://' for s in sorted(_SCHEMES))}"
        )
    import pyarrow.fs

    if not hasattr(pyarrow.fs, _SCHEMES[scheme]):
        raise UserError(
            f'--storage "{storage}": this pyarrow has no {_SCHEMES[scheme]} (reinstall pyarrow with {scheme} support)'
        )
    if not parsed.netloc:
        raise UserError(f'--storage "{storage}" names no bucket or host; e.g. {scheme}://my-bucket/vitplast')
    return join(storage)
