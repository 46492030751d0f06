"""Services that are not there, refused before Ray starts: a tracking URI of an unknown scheme (from the flag or
MLflow's environment variable), a tracking server or database that does not answer (a closed port), a server that is
not MLflow's or refuses this client, a SQLite store cut short, a storage endpoint that is closed or refuses; each is one
line and exit 2, with no Ray session and nothing written, the dry run included."""

from __future__ import annotations

import sqlite3

import pytest
from _commands import ray_sessions, refused
from _servers import MLFLOW_API, closed_port, http_server
from test_bad_input import world  # noqa: F401 (the fixture)

pytestmark = pytest.mark.usefixtures("world")  # the files the cases name, in tmp_path


def search(tmp, capsys, *args: str) -> str:
    """``vitplast search`` of the GOOD space with storage {tmp}/new (not there yet) and ``args``, refused: its one
    line."""
    storage = tmp / "new"
    line = refused("search", ["--space", str(tmp / "space.yaml"), "--storage", str(storage), *args], tmp, capsys)
    assert not storage.exists(), "the storage folder was made"
    return line


def test_a_tracking_server_that_does_not_answer_is_one_line(tmp_path, capsys):
    port = closed_port()
    line = search(tmp_path, capsys, "--tracking-uri", f"http://127.0.0.1:{port}")  # hung for 150 s before
    assert f"the MLflow tracking server http://127.0.0.1:{port} (from --tracking-uri) did not answer" in line
    assert "(Connection refused): check that `mlflow server` runs there" in line


def test_an_unknown_scheme_from_mlflows_variable_is_one_line_in_a_dry_run_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "garbage://x")  # a traceback after Ray started before
    for dry in ([], ["--dry-run"]):  # the dry run accepted it
        line = search(tmp_path, capsys, *dry)
        assert 'MLflow tracking URI "garbage://x" (from $MLFLOW_TRACKING_URI): unknown scheme garbage://' in line
        assert "http://" in line and "sqlite://" in line


@pytest.mark.parametrize(
    "status, said",
    [
        (404, "answered HTTP 404 to MLflow's REST API: it is not an MLflow tracking server"),
        (403, "refused this client"),
    ],
)
def test_a_server_that_is_not_mlflows_or_refuses_us_is_one_line(tmp_path, capsys, status, said):
    with http_server({MLFLOW_API: status}) as url:
        assert said in search(tmp_path, capsys, "--tracking-uri", url)


def test_a_database_server_that_does_not_answer_is_one_line(tmp_path, capsys):
    port = closed_port()
    line = search(tmp_path, capsys, "--tracking-uri", f"postgresql://me@127.0.0.1:{port}/mlflow")
    assert f"the postgresql server of MLflow's store 127.0.0.1:{port} (from --tracking-uri) did not answer" in line


def test_a_sqlite_store_cut_short_is_one_line(tmp_path, capsys):
    store = tmp_path / "store" / "mlflow.db"
    store.parent.mkdir()
    with sqlite3.connect(store) as db:
        db.execute("CREATE TABLE runs (id TEXT, data BLOB)")
        db.executemany("INSERT INTO runs VALUES (?, ?)", [(str(i), b"x" * 4000) for i in range(50)])
    store.write_bytes(store.read_bytes()[: store.stat().st_size // 2])
    line = search(tmp_path, capsys, "--tracking-uri", f"sqlite:///{store}")
    assert f"the MLflow store {store} (from --tracking-uri) is corrupt (truncated: " in line


@pytest.mark.slow  # a child process or a server of its own
def test_a_storage_endpoint_that_is_closed_or_refuses_is_one_line(tmp_path, capsys):
    port = closed_port()
    uri = f"s3://bucket/searches?endpoint_override=127.0.0.1:{port}&scheme=http"  # a traceback after Ray before
    line = refused("search", ["--space", str(tmp_path / "space.yaml"), "--storage", uri], tmp_path, capsys)
    assert f"the storage {uri} (from --storage) is not usable (" in line and "Could not connect" in line
    with http_server({}, default=403) as url:  # an endpoint that answers, and refuses every request
        uri = f"s3://bucket/searches?endpoint_override={url.removeprefix('http://')}&scheme=http"
        line = refused(
            "search", ["--space", str(tmp_path / "space.yaml"), "--storage", uri, "--dry-run"], tmp_path, capsys
        )
    assert f"the storage {uri} (from --storage) is not usable (" in line and "check the bucket exists" in line


def test_a_dry_run_that_refuses_its_input_makes_no_storage_folder(tmp_path, capsys):
    line = search(tmp_path, capsys, "--dry-run", "--model", "vit_bace_patch16_224")  # it made the folder before
    assert 'unknown timm model "vit_bace_patch16_224"' in line
    assert ray_sessions() == set()
