"""The service checks' bounded waits and the files they read: a storage endpoint that takes the connection and never
answers is given up after the timeout (its client killed), a SQLite file is judged by its header and length, a
folder's probe leaves nothing behind."""

from __future__ import annotations

import socket
import sqlite3

import pytest

from vitplast_tune.errors import UserError
from vitplast_tune.plan import services


def test_a_storage_endpoint_that_never_answers_is_given_up_after_the_timeout():
    with socket.socket() as silent:  # takes connections (the kernel's backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        uri = f"s3://bucket/x?endpoint_override=127.0.0.1:{port}&scheme=http"  # pyarrow alone waits 100 s
        with pytest.raises(UserError) as refused:
            services.check_storage(uri, "--storage", timeout_s=3)
    assert str(refused.value).startswith(f"the storage {uri} (from --storage) is not usable (no answer within 3 s)")


def test_a_sqlite_file_is_judged_by_its_header_length_and_schema(tmp_path):
    db = tmp_path / "store.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (x BLOB)")
        con.executemany("INSERT INTO t VALUES (?)", [(b"x" * 4000,) for _ in range(20)])
    assert services.sqlite_problem(db) is None
    (tmp_path / "empty.db").write_bytes(b"")
    assert services.sqlite_problem(tmp_path / "empty.db") is None  # SQLite makes its tables in it
    (tmp_path / "text.db").write_text("not a database" * 10)
    assert services.sqlite_problem(tmp_path / "text.db") == "not a SQLite database"
    db.write_bytes(db.read_bytes()[:8192])
    assert services.sqlite_problem(db).startswith("truncated: 8,192 of its ")


def test_the_writable_probe_leaves_nothing_and_makes_no_folder(tmp_path):
    services.check_writable(tmp_path / "a" / "b", "the storage")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file, not a folder"):
        services.check_writable(tmp_path / "file" / "under", "the storage")


@pytest.mark.parametrize("scheme", ["postgresql", "mysql", "mssql"])
def test_a_database_server_that_takes_the_connection_and_never_answers_is_refused_within_the_timeout(scheme):
    with socket.socket() as silent:  # the port open, nothing behind it that speaks the database's protocol
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        with pytest.raises(UserError) as refused:
            services._check_database(f"{scheme}://u@127.0.0.1:{port}/mlflow", scheme, "--tracking-uri", 1.5)
    assert str(refused.value) == (
        f"the {scheme} server of MLflow's store 127.0.0.1:{port} (from --tracking-uri) did not answer within 1.5 s "
        "(timed out): check that it runs and the URI's host and port"
    )


def test_a_postgresql_server_is_known_by_its_answer_to_an_ssl_request():
    from _services import Postgres, postgres_bin

    if postgres_bin("initdb") is None:
        pytest.skip("no PostgreSQL here")
    server = Postgres()
    try:
        services.check_tracking(server.url, "--tracking-uri", timeout_s=5)  # answers: no error
        assert services.handshake("127.0.0.1", server.port, services._HELLO["postgresql"], 5)[:1] in (b"S", b"N")
    finally:
        server.stop()


def test_a_tracking_server_whose_artifact_store_takes_no_file_is_refused():
    from _servers import MLFLOW_API, http_server

    with http_server({MLFLOW_API: 200}, put=500) as url, pytest.raises(UserError) as refused:  # its proxy fails
        services.check_tracking(url, "--tracking-uri", timeout_s=5)
    assert str(refused.value) == (
        f"the artifact store behind the MLflow tracking server {url} (from --tracking-uri) did not take a small file "
        '(HTTP 500: {"error_code": "INTERNAL_ERROR", "message": "could not reach the bucket"}): check the server\'s '
        "--artifacts-destination (its bucket, endpoint and credentials)"
    )
    with http_server({MLFLOW_API: 200}) as url:  # no artifact proxy (PUT unsupported): the clients write themselves
        services.check_tracking(url, "--tracking-uri", timeout_s=5)


@pytest.mark.slow  # a child process or a server of its own
def test_a_real_tracking_server_takes_the_probe_file_and_keeps_nothing_of_it(tmp_path):
    from _services import MlflowServer

    server = MlflowServer(f"sqlite:///{tmp_path / 'server.db'}", None, "artifacts", tmp_path)
    try:
        services.check_tracking(server.url, "--tracking-uri", timeout_s=30)
    finally:
        server.stop()
    assert (tmp_path / "artifacts" / ".vitplast-write-test").is_dir()  # the probe was written there ...
    assert [p for p in (tmp_path / "artifacts").rglob("*") if p.is_file()] == []  # ... and removed
