"""MLflow internals: the UI's saved runs view (an experiment tag whose format only the UI's JavaScript bundle defines).

Read from MLflow 3.17.2's UI bundle (``mlflow/server/js/build``) and 3.18.0's, whose envelope parser, view loader,
search-facet and UI-state keys, chart types and section grid are the same code; tested in Chromium against the
installed version (``tests/records/test_mlflow_ui.py``).
"""

from __future__ import annotations

import mlflow as _mlflow

VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # + the view's key: a JSON envelope {name, createdAt, updatedAt, state}
VIEW_FORMAT_VERSIONS = ("3.17", "3.18")  # major.minor of the UIs whose bundle reads that format
MAX_KEY = 250  # MLflow's longest tag key (and param key)


def installed_version() -> str:
    """The installed MLflow's version."""
    return _mlflow.__version__


def view_supported(version: str | None = None) -> bool:
    """Whether the installed (or given) MLflow version's UI reads the saved-view format of ``VIEW_TAG_PREFIX``."""
    major_minor = ".".join((version or installed_version()).split(".")[:2])
    return major_minor in VIEW_FORMAT_VERSIONS
