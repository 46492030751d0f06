"""Where a search's results live: the storage root (a local or shared path, or a URI such as s3://), the record a
search writes there (``vitplast_search.json``) that ``--resume``, ``analyze``, ``recommend``, ``vitplast-ui`` and
``load_best_model`` read back, and the names of the best trial's files on its MLflow runs.
"""

from __future__ import annotations

import json
import os
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


def default_storage() -> Path:
    """Where searches are stored when ``--storage`` is not given: ``$VITPLAST_RESULTS_DIR``, else
    ``~/vitplast_tune_results``."""
    return Path(os.environ.get(RESULTS_ENV) or Path.home() / "vitplast_tune_results").expanduser()


def is_uri(path: str) -> bool:
    """Whether a storage location is a URI (s3://, gs://, ...) rather than a local path."""
    return "://" in path


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
    return storage.rstrip("/")
