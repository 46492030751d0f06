"""Read MLflow internals: the UI's saved runs view (read from MLflow 3.17.2 and 3.18.0), stores, servers and requests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlflow as _mlflow

from vitplast_tune import environment

VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # + the view's key: a JSON envelope {name, createdAt, updatedAt, state}
VIEW_FORMAT_VERSIONS = ("3.17", "3.18")  # major.minor of the UIs whose bundle reads that format
MAX_KEY = 250  # MLflow's longest tag key (and param key)
MAX_EXPERIMENT_NAME = 500  # MLflow's longest experiment name (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH)
# The logger on which MLflow's SQL store logs each database error with its traceback before it raises it again.
DATABASE_ERROR_LOGGER = "mlflow.store.db.utils"


def installed_version() -> str:
    """Return the installed MLflow's version."""
    return _mlflow.__version__


def view_supported(version: str | None = None) -> bool:
    """Tell whether the installed, or given, MLflow version's UI reads the saved-view format."""
    major_minor = ".".join((version or installed_version()).split(".")[:2])
    return major_minor in VIEW_FORMAT_VERSIONS


def tracking_schemes() -> list[str]:
    """List the URI schemes MLflow's tracking store registry resolves, plugins included."""
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    return sorted(_tracking_store_registry._registry)


def file_store_allowed() -> bool:
    """Tell whether MLflow opens a tracking URI that is a folder; 3.x needs ``MLFLOW_ALLOW_FILE_STORE``."""
    from mlflow import environment_variables

    allowed = getattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE", None)
    return allowed is None or bool(allowed.get())


def ask_server(
    uri: str, endpoint: str, timeout_s: float, params: dict | None = None, method: str = "GET", **more: Any
) -> Any:
    """Send one request to a tracking server as MLflow's client does, without retries, and return the response."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    creds = get_default_host_creds(uri)
    if params is not None:
        more["params"] = params
    return http_request(creds, endpoint, method, max_retries=0, timeout=timeout_s, raise_on_status=False, **more)


ARTIFACTS_API = "/api/2.0/mlflow-artifacts/artifacts"  # a server's artifact proxy (mlflow server --serve-artifacts)


# On by default: `mlflow server` and `mlflow ui` then start a job runner and seven Huey consumers for MLflow's GenAI
# jobs. This package runs no such job (what they cost: docs/development.md).
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def server_env() -> dict[str, str]:
    """Return this process's environment for an MLflow server it starts: MLflow's job runner off, unless set."""
    return {JOB_EXECUTION_ENV: "false", **os.environ}


PROGRESS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


@contextmanager
def no_artifact_progress_bar() -> Iterator[None]:
    """Turn MLflow's artifact progress bar off while the block runs."""
    key = PROGRESS_BAR_ENV
    saved = environment.read(PROGRESS_BAR_ENV)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


# What a database says when an insert meets a key another client wrote first (PostgreSQL, SQLite, MySQL); MLflow's SQL
# store passes it on in its exception's message, also through a tracking server.
_DUPLICATE_KEY = ("UniqueViolation", "duplicate key value", "UNIQUE constraint failed", "Duplicate entry")


def written_first_by_another(exc: BaseException) -> bool:
    """Tell whether MLflow refused a write because another client wrote the same record first."""
    return any(said in str(exc) for said in _DUPLICATE_KEY)
