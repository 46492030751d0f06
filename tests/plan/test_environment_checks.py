"""The environment variables a search reads, checked in its plan: a value that cannot work is one line naming the
variable (not a flag that was not given) and exit code 2 before Ray starts, from ``vitplast search`` run in this
process; the checks themselves called directly."""

from __future__ import annotations

import pytest
from _commands import refused, search_args

from vitplast_tune.config import cache_dir
from vitplast_tune.errors import ServicesError, UserError
from vitplast_tune.plan import services

# (variable, its value ({tmp}: the test's folder, where a-file is a file), what the one line says)
CASES = [
    (
        "MLFLOW_TRACKING_URI",
        "::nonsense",
        'MLflow tracking URI "::nonsense" (from $MLFLOW_TRACKING_URI): unknown scheme',
    ),
    (
        "MLFLOW_TRACKING_URI",
        "{tmp}/mlruns",
        "(from $MLFLOW_TRACKING_URI) names a folder, a file store, which MLflow",
    ),
    ("VITPLAST_CACHE_DIR", "{tmp}/a-file", "VITPLAST_CACHE_DIR={tmp}/a-file is a file; point it at a folder"),
    (
        "VITPLAST_CACHE_DIR",
        "{tmp}/a-file/cache",
        "VITPLAST_CACHE_DIR={tmp}/a-file/cache lies under {tmp}/a-file, which",
    ),
    ("VITPLAST_RESULTS_DIR", "{tmp}/a-file", "$VITPLAST_RESULTS_DIR {tmp}/a-file is a file; name a folder"),
    ("VITPLAST_LOG_LEVEL", "LOUD", "VITPLAST_LOG_LEVEL=LOUD names no level; use one of DEBUG, INFO, WARNING, ERROR"),
    ("VITPLAST_CLUSTER_CONFIG", "{tmp}/none.yaml", "VITPLAST_CLUSTER_CONFIG={tmp}/none.yaml is not a file; point it"),
]


@pytest.mark.parametrize("variable, value, message", CASES, ids=[f"{c[0]}={c[1]}" for c in CASES])
def test_a_variable_that_cannot_work_is_one_line_naming_it_before_ray(
    variable, value, message, tiny_space, tmp_path, monkeypatch, capsys
):
    """Before: a search run with MLflow's file store (refused by MLflow 3 once Ray was up), a cache that is a file
    (after Ray started), an unknown log level taken for INFO without a word, ``--storage`` blamed for the variable."""
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv(variable, value.replace("{tmp}", str(tmp_path)))
    argv = search_args(tiny_space(), "env", tmp_path / "results", "--dry-run")
    if variable == "VITPLAST_RESULTS_DIR":
        argv = [a for a in argv if a not in ("--storage", str(tmp_path / "results"))]  # the variable's storage
    if variable == "VITPLAST_CLUSTER_CONFIG":
        argv += ["--address", "127.0.0.1:1"]  # read for a cluster joined: refused before any connection
    line = refused("search", argv, tmp_path, capsys)
    assert message.replace("{tmp}", str(tmp_path)) in line
    assert "--storage" not in line and "--tracking-uri" not in line


def test_the_checks_name_the_variable_when_called_directly(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("VITPLAST_CACHE_DIR", str(tmp_path / "a-file"))
    with pytest.raises(UserError, match="^VITPLAST_CACHE_DIR=.* is a file"):
        cache_dir()
    monkeypatch.setenv("VITPLAST_CACHE_DIR", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache" and not (tmp_path / "cache").exists()  # a folder to make: taken, not made
    with pytest.raises(ServicesError, match=r'"::nonsense" \(from \$MLFLOW_TRACKING_URI\): unknown scheme \(none\)'):
        services.check_tracking("::nonsense", "$MLFLOW_TRACKING_URI")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow opens a file store then: so does the plan
    services.check_tracking(str(tmp_path / "mlruns"), "$MLFLOW_TRACKING_URI")
    assert not (tmp_path / "mlruns").exists()
