"""Reach the services a search writes to before Ray starts: the MLflow tracking store and the storage.

Each wait is bounded, and each problem is one ``UserError`` that names the service and where its address came from.
Probes leave nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import sqlite3
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from vitplast_tune.errors import ServicesError
from vitplast_tune.storage import filesystem, join
from vitplast_tune.subprocess_call import call_in_child

TIMEOUT_S = 10.0  # how long a tracking server or database gets to answer
STORAGE_TIMEOUT_S = 30.0  # how long a bucket gets to answer and take a probe file (pyarrow retries for a while)
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
_SQLITE_HEADER = b"SQLite format 3\x00"


def check_tracking(uri: str, origin: str, timeout_s: float = TIMEOUT_S) -> None:
    """Raise UserError unless ``uri`` names an MLflow store that answers within ``timeout_s``."""
    from vitplast_tune._compat import mlflow as mlflow_internals

    parts = urlsplit(uri)
    scheme = parts.scheme.lower().split("+")[0]  # postgresql+psycopg2 -> postgresql
    known = mlflow_internals.tracking_schemes()
    if scheme not in known or not uri.strip() or (not scheme and ":" in uri):  # "::x": no scheme, nor a folder
        schemes = ", ".join(f"{s}://" for s in known if s)
        raise ServicesError(
            f'MLflow tracking URI "{uri}" (from {origin}): unknown scheme {scheme or "(none)"}://; use one of '
            f"{schemes}, or a local path (e.g. sqlite:///results/mlflow.db, http://127.0.0.1:5000)"
        )
    if scheme in ("", "file") and not mlflow_internals.file_store_allowed():
        raise ServicesError(
            f'MLflow tracking URI "{uri}" (from {origin}) names a folder, a file store, which MLflow '
            f"{mlflow_internals.installed_version()} opens only with MLFLOW_ALLOW_FILE_STORE=true; give a database "
            "(sqlite:///<folder>/mlflow.db) or a server (http://...)"
        )
    if scheme in ("http", "https"):
        _check_server(uri.rstrip("/"), origin, timeout_s)
    elif scheme == "sqlite":
        _check_sqlite(uri, origin)
    elif scheme in DATABASE_PORTS:
        _check_database(uri, scheme, origin, timeout_s)
    elif scheme in ("", "file"):
        folder = Path(parts.path if scheme == "file" else uri).expanduser()
        check_writable(folder, f"the MLflow file store {folder} (from {origin})")


def _check_server(uri: str, origin: str, timeout_s: float) -> None:
    """Check that a tracking server answers MLflow's REST API within ``timeout_s``."""
    from mlflow.exceptions import MlflowException

    from vitplast_tune._compat import mlflow as mlflow_internals

    what = f"the MLflow tracking server {uri} (from {origin})"
    try:
        answer = mlflow_internals.ask_server(uri, "/api/2.0/mlflow/experiments/search", timeout_s, {"max_results": 1})
    except (MlflowException, OSError) as exc:
        raise ServicesError(
            f"{what} did not answer within {timeout_s:g} s ({_reason(exc)}): check that `mlflow server` runs there "
            "and the URI's host and port, or give another tracking URI"
        ) from None
    if answer.status_code in (401, 403):
        raise ServicesError(
            f"{what} refused this client (HTTP {answer.status_code}): set MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN"
        )
    if answer.status_code != 200:
        raise ServicesError(
            f"{what} answered HTTP {answer.status_code} to MLflow's REST API: it is not an MLflow tracking server, "
            "or not at that path; check the URI"
        )
    _check_artifact_proxy(uri, what, timeout_s)


def _check_artifact_proxy(uri: str, what: str, timeout_s: float) -> None:
    """Check that a server that proxies artifacts takes a small file into its store, then remove it."""
    from mlflow.exceptions import MlflowException

    from vitplast_tune._compat import mlflow as mlflow_internals

    probe = f"{mlflow_internals.ARTIFACTS_API}/.vitplast-write-test/{os.getpid()}-{time.time_ns()}"
    try:
        answer = mlflow_internals.ask_server(uri, probe, timeout_s, method="PUT", data=b"vitplast")
    except (MlflowException, OSError) as exc:
        problem = f"no answer within {timeout_s:g} s ({_reason(exc)})"
    else:
        if answer.status_code in (404, 501):
            return  # not a proxy: the runs' artifacts go where the server tells each client
        problem = "" if answer.status_code < 300 else f"HTTP {answer.status_code}: {_reason(Exception(answer.text))}"
    if problem:
        raise ServicesError(
            f"the artifact store behind {what} did not take a small file ({problem}): check the server's "
            "--artifacts-destination (its bucket, endpoint and credentials)"
        )
    with contextlib.suppress(MlflowException, OSError):  # a probe left behind is a few bytes; the check passed
        mlflow_internals.ask_server(uri, probe, timeout_s, method="DELETE")


def _check_sqlite(uri: str, origin: str) -> None:
    """Check a SQLite store: its file whole, or its folder writable or makeable."""
    database = uri.split(":///", 1)[1].split("?")[0] if ":///" in uri else ""
    if not database or database == ":memory:":
        return
    path = Path(database).expanduser()
    if not path.exists():
        check_writable(path.parent, f"the folder of the MLflow store {path} (from {origin})")
        return
    problem = sqlite_problem(path)
    if problem:
        raise ServicesError(
            f"the MLflow store {path} (from {origin}) is corrupt ({problem}): restore it from a backup, or record "
            "elsewhere (another --tracking-uri or --storage); its runs cannot be read"
        )


def sqlite_problem(path: Path) -> str | None:
    """Say what is wrong with a SQLite file, from its header, length and schema; None when it looks whole."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
        size = path.stat().st_size
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    if size == 0:
        return None  # an empty file is an empty database (SQLite makes its tables in it)
    if len(header) < 100 or not header.startswith(_SQLITE_HEADER):
        return "not a SQLite database"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages, valid_for, changes = (int.from_bytes(header[i : i + 4], "big") for i in (28, 92, 24))
    if valid_for == changes and pages and size < pages * page_size:
        return f"truncated: {size:,} of its {pages * page_size:,} bytes"
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return None


def _check_database(uri: str, scheme: str, origin: str, timeout_s: float) -> None:
    """Check a database server: its driver installed, and its port answering as that server."""
    import sqlalchemy
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = sqlalchemy.engine.make_url(uri)
        url.get_dialect()  # imports the driver module
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise ServicesError(
            f'MLflow tracking URI "{uri}" (from {origin}): {_reason(exc)}; install its driver'
        ) from None
    host, port = url.host or "localhost", url.port or DATABASE_PORTS[scheme]
    try:
        answer = handshake(host, port, _HELLO[scheme], timeout_s)
    except OSError as exc:
        answer, problem = b"", _reason(exc)
    else:
        problem = "" if _ANSWERS[scheme](answer) else f"its answer {answer[:8]!r} is not {scheme}'s"
    if problem:
        raise ServicesError(
            f"the {scheme} server of MLflow's store {host}:{port} (from {origin}) did not answer within "
            f"{timeout_s:g} s ({problem}): check that it runs and the URI's host and port"
        )


# What each database server is first sent (nothing: MySQL speaks first), and how its first answer looks: PostgreSQL
# answers an SSLRequest with one byte (S, N, or E from an old server), MySQL greets with a packet of sequence 0 and a
# protocol version (10, or 255 with an error), SQL Server answers a TDS pre-login with a tabular-result packet (4).
_HELLO = {
    "postgresql": (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big"),
    "mysql": b"",
    "mssql": bytes.fromhex("12010014000001000000060006ff000000000000"),  # header, VERSION, its 6 bytes
}
_ANSWERS = {
    "postgresql": lambda a: a[:1] in (b"S", b"N", b"E"),
    "mysql": lambda a: len(a) >= 5 and a[3] == 0 and a[4] in (10, 255),
    "mssql": lambda a: a[:1] == b"\x04",
}


def handshake(host: str, port: int, hello: bytes, timeout_s: float) -> bytes:
    """Send ``hello`` to ``host:port`` and return the first bytes the server answers, all within ``timeout_s``.

    Raises:
        OSError: The connection or the exchange failed, or took too long (``TimeoutError``).
    """
    deadline = time.monotonic() + timeout_s
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        if hello:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            conn.sendall(hello)
        conn.settimeout(max(deadline - time.monotonic(), 0.001))
        answer = conn.recv(64)
    if not answer:
        raise ConnectionResetError(errno.ECONNRESET, "the server closed the connection without a word")
    return answer


def check_writable(folder: Path, what: str, advice: str = "") -> None:
    """Raise UserError unless ``folder`` can take files, or be made; a probe folder is made and removed."""
    existing = Path(folder).expanduser().absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ServicesError(f"{what}: {existing} is a file, not a folder{advice}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-test-", dir=existing))
    except OSError as exc:
        raise ServicesError(f"{what} is not writable ({exc.strerror} in {existing}){advice}") from None


def check_storage(uri: str, origin: str, timeout_s: float = STORAGE_TIMEOUT_S) -> None:
    """Raise UserError unless a storage URI answers and takes a probe file within ``timeout_s``, in a child process."""
    try:
        problem = call_in_child("vitplast_tune.plan.services:_probe_storage", uri, timeout_s=timeout_s)
    except TimeoutError:
        problem = f"no answer within {timeout_s:g} s"
    if problem:
        raise ServicesError(
            f"the storage {uri} (from {origin}) is not usable ({problem}): check the bucket exists, its endpoint "
            "(an S3-compatible server: ?endpoint_override=HOST:PORT&scheme=http) and the credentials"
        )


def _probe_storage(uri: str) -> str | None:
    """Write and remove a probe file under a storage URI; return what failed, or None."""
    try:
        fs, path = filesystem(uri)
        probe = join(path, f".write-test-{os.getpid()}")
        with fs.open_output_stream(probe) as out:
            out.write(b"")
        fs.delete_file(probe)
    except Exception as exc:  # pyarrow raises OSError, ValueError and its own errors
        return _reason(exc)
    return None


def _reason(exc: BaseException) -> str:
    """Return the short reason of a failed call: its ``[Errno N] text``, else its first line."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text) or re.search(r"Details: ([^;\n]+)", text)
    return (found.group(1) if found else (text.strip().splitlines() or [type(exc).__name__])[0]).strip()[:200]
