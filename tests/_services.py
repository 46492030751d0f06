"""A team's tracking services on 127.0.0.1 for the tests, each started by pid and stopped with what it started:
PostgreSQL (Debian's ``postgresql`` package; initdb'd into a directory of its own) and ``mlflow server`` on it with
its artifacts in an S3 bucket (``_raycluster.MotoS3``)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _raycluster import S3_CREDENTIALS, MotoS3, Owned, free_ports

from vitplast_tune._compat import mlflow as mlflow_internals


def postgres_bin(program: str) -> str | None:
    """The path of a PostgreSQL program: on PATH, else in Debian's versioned folder (/usr/lib/postgresql/N/bin)."""
    found = shutil.which(program)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{program}"), key=lambda p: int(p.split("/")[4]))
    return versions[-1] if versions else None


class Postgres:
    """A PostgreSQL server of the test's own on 127.0.0.1 with one database (``url``), trusting local connections.

    PostgreSQL refuses to run as root, so a root process runs it (initdb and the server) as the ``postgres`` user
    Debian's package made, in a directory under /tmp that user owns; any other user runs it as itself.
    """

    def __init__(self, database: str = "mlflow", user: str = "vitplast"):
        import psycopg

        self.root = Path(tempfile.mkdtemp(prefix="vtpg", dir="/tmp"))
        owner = "postgres" if os.geteuid() == 0 else None
        if owner:
            shutil.chown(self.root, owner, owner)
        data = self.root / "data"
        initdb = [postgres_bin("initdb"), "-D", str(data), "-U", user, "--auth=trust", "-E", "UTF8", "--no-sync"]
        subprocess.run(initdb, check=True, capture_output=True, user=owner, timeout=120)
        (self.port,) = free_ports(1)
        cmd = [postgres_bin("postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port), "-k", str(self.root)]
        self.server = Owned(
            [*cmd, "-c", "fsync=off"], dict(os.environ), self.root.parent / f"{self.root.name}.log", user=owner
        )
        where = dict(host="127.0.0.1", port=self.port, user=user, dbname="postgres")
        self._wait(lambda: psycopg.connect(**where).close())
        with psycopg.connect(**where, autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {database}")
        self.url = f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def _wait(self, connect, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                return connect()
            except Exception:
                if time.time() > deadline or not self.server.running():
                    raise RuntimeError(f"PostgreSQL did not start:\n{self.server.tail()}") from None
                time.sleep(0.3)

    def stop(self) -> None:
        self.server.stop(grace_s=30)
        shutil.rmtree(self.root, ignore_errors=True)


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with its runs in ``backend`` (a database URL) and its artifacts in the S3
    bucket of ``s3`` (the server proxies them: clients need no S3 access), or in a local folder without ``s3``;
    ``restart`` stops and starts it on the same port."""

    def __init__(self, backend: str, s3: MotoS3 | None, prefix: str, log_dir: Path):
        if s3 is None:  # artifacts in a local folder (under log_dir)
            self.artifacts, self.env = str(log_dir / prefix), {**os.environ, "PYTHONUNBUFFERED": "1"}
        else:
            self.artifacts = f"s3://{s3.bucket}/{prefix}"
            self.env = {**os.environ, **S3_CREDENTIALS, "MLFLOW_S3_ENDPOINT_URL": s3.url, "PYTHONUNBUFFERED": "1"}
        self.backend = backend
        self.env.pop("MLFLOW_TRACKING_URI", None)
        self.env[mlflow_internals.JOB_EXECUTION_ENV] = "false"  # MLflow's GenAI jobs: no search uses them
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir, self.starts = log_dir, 0
        self.start()

    def start(self, timeout: float = 180) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.backend]
        cmd += ["--artifacts-destination", self.artifacts, "--host", "127.0.0.1", "--port", str(self.port)]
        self.starts += 1
        self.server = Owned([*cmd, "--workers", "1"], self.env, self.log_dir / f"mlflow-{self.starts}.log")
        deadline = time.time() + timeout
        while time.time() < deadline and self.server.running():
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"mlflow server did not start:\n{self.server.tail()}")

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        self.server.stop(grace_s=20, group=True)
