"""Shared fixtures: isolation of every test from the machine and from each other, tiny ViTs and space files, and a
local Ray instance with 1 CPU.

Every test runs with its own cache directory (``VITPLAST_CACHE_DIR``), results directory (``VITPLAST_RESULTS_DIR``),
working directory (where MLflow's defaults would land, which tests check stays empty) and Ray temp dir
(``RAY_TMPDIR``, for the Ray instances its subprocesses start), and with no ``RAY_ADDRESS`` and none of MLflow's
``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME`` and ``MLFLOW_EXPERIMENT_ID``: nothing it writes or starts is seen
by another test, and nothing already on the machine (a warm cache, a running cluster, a user's MLflow server) changes
what it measures. Fixtures of
a wider scope (a module's search) get the session's own directories.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# One compute thread per process, set before torch loads: the suite runs two test processes on two cores, each
# starting Ray workers and child processes, and OpenMP's threads of a process that has two spin on a busy core
# (the fast tests of tests/vit took 1.4-1.9x the CPU time with torch's default of two threads). Ray's workers get
# as many threads as their CPUs anyway; the children these tests start inherit this.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import pytest
import torch
from _costs import costliest_first, load_costs
from _spaces import space_text
from timm.models.vision_transformer import VisionTransformer


@pytest.fixture
def tiny_space(tmp_path):
    """Write a tiny space file (``space_text``'s arguments, and ``name``) into the test's directory; return its path."""

    def write(name: str = "space", **changes: Any) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(space_text(**changes))
        return path

    return write


INHERITED = ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")  # never inherited


def _short_dir(prefix: str) -> str:
    """A short directory under /tmp: Ray's socket paths must stay under 108 bytes."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


@pytest.fixture(scope="session", autouse=True)
def _session_isolation(tmp_path_factory):
    """The session's own cache, results and Ray temp directories, for fixtures wider than one test."""
    root = tmp_path_factory.mktemp("session")
    ray_tmp = _short_dir("vts")
    saved = {k: os.environ.get(k) for k in ("VITPLAST_CACHE_DIR", "VITPLAST_RESULTS_DIR", "RAY_TMPDIR", *INHERITED)}
    os.environ.update(
        VITPLAST_CACHE_DIR=str(root / "cache"), VITPLAST_RESULTS_DIR=str(root / "results"), RAY_TMPDIR=ray_tmp
    )
    for key in INHERITED:
        os.environ.pop(key, None)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _mlflow_stores_from_one_schema(schema: Path) -> None:
    """Make each new SQLite MLflow store of this process from the schema MLflow made for its first one.

    MLflow makes a new store by running its schema migrations one by one, and the tests of one process make
    dozens. The first store is made by MLflow's own function and copied aside; each later
    one gets that copy (SQLite's backup API): the same tables at the same alembic revision, and the same log line.
    The commands, servers and workers these tests start in other processes make their stores as users' do. Applied
    once MLflow is loaded (``_isolation``), so that a process that never loads it does not load it for this.
    """
    import sqlite3

    import mlflow.store.db.utils as db_utils
    import mlflow.store.model_registry.sqlalchemy_store as registry

    real = db_utils._initialize_tables
    if getattr(real, "from_one_schema", False):
        return

    def copy(source: str | Path, target: str | Path) -> None:
        a, b = sqlite3.connect(source), sqlite3.connect(target)
        try:
            a.backup(b)
        finally:
            a.close()
            b.close()

    def initialize(engine) -> None:
        path = engine.url.database
        if engine.url.get_backend_name() != "sqlite" or not path or path == ":memory:":
            return real(engine)
        if not schema.exists():
            real(engine)
            copy(path, f"{schema}.part")
            os.replace(f"{schema}.part", schema)  # whole, or not there, for another thread of this process
            return None
        db_utils._logger.info("Creating initial MLflow database tables...")  # as MLflow's own function says
        copy(schema, path)
        return None

    initialize.from_one_schema = True  # type: ignore[attr-defined]
    db_utils._initialize_tables = registry._initialize_tables = initialize


@pytest.fixture(autouse=True)
def _isolation(tmp_path, tmp_path_factory, monkeypatch):
    """This test's own cache, results, working and Ray temp directories; after it, MLflow's process-wide tracking
    URI and active run are reset, so that neither reaches the next test of this worker."""
    ray_tmp = _short_dir("vt")
    monkeypatch.setenv("VITPLAST_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VITPLAST_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    for key in INHERITED:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    if "mlflow.store.db.utils" in sys.modules:  # loaded by an earlier test of this process
        _mlflow_stores_from_one_schema(tmp_path_factory.getbasetemp() / "mlflow-schema.db")
    yield
    shutil.rmtree(ray_tmp, ignore_errors=True)
    if (mlflow := sys.modules.get("mlflow")) is not None:  # loaded by this test or an earlier one
        if mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(None)


class _Messages(logging.Handler):
    """Collects the formatted messages of the records it handles."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def library_log():
    """The messages the library logs (``vitplast_tune`` and its children) during the test, at INFO and above."""
    handler, logger = _Messages(), logging.getLogger("vitplast_tune")
    level = logger.level  # a command run earlier in this worker may have quieted it (--quiet)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture
def tiny_vit() -> VisionTransformer:
    """A 2-block, 32-wide random ViT on 32 px images with 5 classes, in eval mode."""
    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5).eval()


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance of this session's own (never one already running), with an explicit small resource set,
    shut down after the session. One CPU: the in-process searches run one trial at a time, in one trial worker that
    imports torch once (4-5 CPU seconds a process; the suite is CPU-bound on two cores, its workers run two tests at
    once). Trials at once are the tests' whose searches start their own Ray (2 CPUs) or join a cluster."""
    import ray

    ray.init(
        address="local",
        num_cpus=1,
        num_gpus=0,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _temp_dir=_short_dir("vtr"),
    )
    yield ray
    ray.shutdown()


def pytest_collection_modifyitems(config, items):
    """Order the test files from the costliest down (``tests/file_costs.json``, written by ``tests/_costs.py``).

    pytest-xdist, under ``--dist loadfile --no-loadscope-reorder`` (pyproject.toml), hands whole files to the
    workers in this order as each frees up; costliest first, both workers end together instead of one running a long
    end-to-end file alone at the end. The tests of one file keep their order.
    """
    costliest_first(items, load_costs())


STRICT_SKIPS = "VITPLAST_STRICT_SKIPS"  # CI sets it: a test that skips there fails instead


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With ``VITPLAST_STRICT_SKIPS=1`` (as ``.ci/run`` sets), a skipped test is reported as failed: a missing
    browser or a taken port must not keep CI green while hiding what was not tested."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get(STRICT_SKIPS) == "1" and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"skipped, which {STRICT_SKIPS}=1 counts as a failure: {reason}"
