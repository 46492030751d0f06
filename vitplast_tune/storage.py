"""Say where a search's results live: the storage root, the search's record there, and its best trial's file names.

A URI may carry pyarrow's filesystem options as a query; ``join`` keeps it at the end and ``filesystem`` opens it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from vitplast_tune import environment
from vitplast_tune.errors import UserError

if TYPE_CHECKING:
    import pyarrow.fs

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
    """Say where a search keeps its records.

    ``storage`` is its storage root (a path or a URI); ``search_id`` is the unique id that tags its MLflow parent run.
    """

    name: str
    storage: str
    tracking_uri: str
    experiment: str
    search_id: str = ""

    @property
    def location(self) -> str:
        """Return where Ray Tune keeps the search: its storage joined with its name."""
        return join(self.storage, self.name)

    @property
    def local_dir(self) -> Path | None:
        """Return the search's directory when storage is a local path, else None."""
        return None if is_uri(self.storage) else Path(self.storage) / self.name

    @property
    def results_dir(self) -> Path:
        """Return where the search's own files go: its directory, else a local one."""
        return self.local_dir or default_storage() / self.name

    def in_default_storage(self) -> bool:
        """Tell whether the search lies in ``default_storage()``, so its commands need no ``--storage``."""
        return self.local_dir is not None and Path(self.storage) == default_storage().resolve()


def default_storage() -> Path:
    """Find where searches are stored without ``--storage``: ``$VITPLAST_RESULTS_DIR``, else
    ``~/vitplast_tune_results``.
    """
    return Path(environment.read(RESULTS_ENV) or Path.home() / "vitplast_tune_results").expanduser()


def spoken(location: str | Path) -> str:
    """Write a path or a ``sqlite:///`` URL as a user types it, the home folder as ``~`` or ``$HOME``."""
    text, home = str(location), str(Path.home())
    for prefix, shown in (("sqlite:///", "sqlite:///$HOME"), ("", "~")):
        if home != "/" and (text == prefix + home or text.startswith(f"{prefix}{home}/")):
            return shown + text[len(prefix + home) :]
    return text


def is_uri(path: str) -> bool:
    """Tell whether a storage location is a URI rather than a local path."""
    return "://" in path


def join(location: str, *parts: str) -> str:
    """Extend a storage location (a path or a URI) by more parts, a URI's parts before its query."""
    if not is_uri(location):
        return str(Path(location, *parts))
    base, mark, query = location.partition("?")
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)]) + mark + query


def filesystem(location: str) -> tuple[pyarrow.fs.FileSystem, str]:
    """Open the pyarrow filesystem of a storage location, as Ray Tune does, and return it with the path in it."""
    import pyarrow.fs

    if not is_uri(location):
        return pyarrow.fs.LocalFileSystem(), str(Path(location).expanduser())
    return pyarrow.fs.FileSystem.from_uri(location)


def download(fs: pyarrow.fs.FileSystem, path: str, into: Path) -> Path:
    """Copy a file of a pyarrow filesystem into a local folder and return the local copy."""
    import pyarrow.fs

    target = Path(into) / Path(path).name
    pyarrow.fs.copy_files(path, str(target), source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem())
    return target


def upload(folder: Path, location: str) -> None:
    """Copy a local folder's files into a storage location (a path or a URI), made if missing."""
    import pyarrow.fs

    fs, path = filesystem(location)
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        fs.create_dir(path, recursive=True)
    pyarrow.fs.copy_files(str(folder), path, source_filesystem=pyarrow.fs.LocalFileSystem(), destination_filesystem=fs)


def fetch(location: str, into: Path) -> bool:
    """Copy the files of a storage folder into a local folder; return whether there was such a folder."""
    import pyarrow.fs

    fs, path = filesystem(location)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.Directory:
        return False
    Path(into).mkdir(parents=True, exist_ok=True)
    pyarrow.fs.copy_files(path, str(into), source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem())
    return True


def remove(location: str) -> None:
    """Delete a storage folder (a path or a URI) and what it holds, if it is there."""
    import pyarrow.fs

    fs, path = filesystem(location)
    if fs.get_file_info(path).type == pyarrow.fs.FileType.Directory:
        fs.delete_dir(path)


def search_dir(name: str, storage: str | Path | None = None) -> Path:
    """Find the directory of a search under ``storage`` (None: ``default_storage()``)."""
    return Path(storage or default_storage()).expanduser() / name


def read_record(directory: Path, purpose: str = "to resume") -> dict[str, Any]:
    """Read the record of the search stored in a directory.

    ``purpose`` says what the record is read for, in the message when there is none. Raises UserError when there is no
    record, or it is unreadable or incomplete.
    """
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


@contextlib.contextmanager
def replaced(path: Path) -> Iterator[Path]:
    """Write a file whole or not at all: the block writes the yielded temporary file, then it replaces ``path``."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_record(directory: Path, record: dict[str, Any]) -> None:
    """Write a search's record whole or not at all, the directory made if missing."""
    directory.mkdir(parents=True, exist_ok=True)
    with replaced(directory / SEARCH_FILE) as partial:
        partial.write_text(json.dumps(record, indent=2, default=str))


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
    """Check a ``--storage`` location (a path or a URI); ``file://`` becomes a path."""
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
