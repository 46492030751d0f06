"""Where a search's results live: the storage root (a local or shared path, or a URI such as s3://), and the record a
search writes there (``vitplast_search.json``) that ``--resume``, ``analyze`` and ``recommend`` read back.
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


def default_storage() -> Path:
    """Where searches are stored when ``--storage`` is not given: ``$VITPLAST_RESULTS_DIR``, else
    ``~/vitplast_tune_results``."""
    return Path(os.environ.get(RESULTS_ENV) or Path.home() / "vitplast_tune_results").expanduser()


def is_uri(path: str) -> bool:
    """Whether a storage location is a URI (s3://, gs://, ...) rather than a local path."""
    return "://" in path


def read_record(directory: Path) -> dict[str, Any]:
    """The record of the search stored in ``directory``; UserError when there is none."""
    path = directory / SEARCH_FILE
    if not path.is_file():
        raise UserError(
            f'no search "{directory.name}" in {directory.parent} (no {SEARCH_FILE} there); check --name and --storage'
        )
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
