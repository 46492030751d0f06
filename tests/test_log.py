"""The library's logger: its messages reach standard error by default (results alone go to standard output), a
level quiets them and holds whatever the order of imports, and an application that configures logging itself gets
them through its own handlers instead."""

from __future__ import annotations

import subprocess
import sys

SAY = "from vitplast_tune.log import get_logger; get_logger('vitplast_tune.run.driver').info('note: hello')"


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)


def test_a_library_message_is_one_line_on_standard_error_by_default():
    out = python(SAY)
    assert out.stderr == "note: hello\n" and out.stdout == ""


def test_a_level_quiets_the_library_and_the_search_commands_quiet_sets_it():
    assert python(f"import logging, vitplast_tune.log as log; log.set_verbosity(logging.WARNING); {SAY}").stderr == ""
    quiet = "import logging; from vitplast_tune.cli.base import quiet_library; quiet_library(True); "
    assert python(quiet + SAY).stderr == ""
    loud = "import logging; from vitplast_tune.cli.base import quiet_library; quiet_library(False); "
    assert python(loud + SAY).stderr == "note: hello\n"


def test_a_level_the_user_sets_holds_whatever_the_import_order():
    quiet = "import logging; logging.getLogger('vitplast_tune').setLevel(logging.WARNING); "
    before = python(quiet + "import vitplast_tune; " + SAY)  # set before the package is imported
    after = python(
        "import vitplast_tune, logging; logging.getLogger('vitplast_tune').setLevel(logging.WARNING); " + SAY
    )
    loaded = "import vitplast_tune.records.table, vitplast_tune.plan.options, logging; "  # modules that log, loaded
    later = python(loaded + "logging.getLogger('vitplast_tune').setLevel(logging.WARNING); " + SAY)
    assert (before.stderr, after.stderr, later.stderr) == ("", "", "")
    warned = python(quiet + SAY.replace(".info('note: hello')", ".warning('warning: hello')"))
    assert warned.stderr == "warning: hello\n"  # the level holds; it does not silence everything


def test_an_application_gets_the_messages_through_its_own_handlers():
    configured = "import logging, vitplast_tune.log as log; logging.basicConfig(format='APP %(name)s %(message)s'); "
    configured += "log.disable_default_handler(); logging.getLogger('vitplast_tune').setLevel(logging.INFO); "
    out = python(configured + SAY)
    assert out.stdout == "" and out.stderr == "APP vitplast_tune.run.driver note: hello\n"
    again = python(configured + "log.enable_default_handler(); " + SAY)
    assert again.stderr == "note: hello\n" and again.stdout == ""


def test_another_librarys_logger_is_quieted_for_a_block_and_restored_after(caplog):
    import logging

    from vitplast_tune.log import quieted

    other = logging.getLogger("some_library")
    other.setLevel(logging.INFO)
    other.warning("before")  # a record passed once is cached as let through: the block must clear that
    with caplog.at_level(logging.INFO, logger="some_library"), quieted("some_library"):
        other.warning("inside")
        other.error("an error still")
    other.warning("after")
    assert [r.getMessage() for r in caplog.records if r.name == "some_library"] == ["before", "an error still", "after"]
    assert other.level == logging.INFO


def test_ray_s_and_mlflow_s_start_up_notices_show_only_when_verbose(tmp_path, monkeypatch):
    """What a search's first seconds printed before its first progress line (issue 57): Ray's token-authentication
    warning (the real function Ray calls at every local start) and MLflow's "Creating initial MLflow database tables"
    (a real SQLite store made); let out of their loggers by --verbose and VITPLAST_LOG_LEVEL=DEBUG only. A handler on
    each logger sees what the logger lets out (the projects' own handlers hold whatever stream they were made with)."""
    import logging
    import logging.handlers

    from mlflow.tracking import MlflowClient
    from ray._private.authentication import authentication_token_setup as auth

    from vitplast_tune import log
    from vitplast_tune._compat.notices import STARTUP_NOTICES
    from vitplast_tune.cli.base import quiet_library

    seen = logging.handlers.BufferingHandler(capacity=10_000)  # keeps every record it is given
    loggers = [logging.getLogger(name) for name in STARTUP_NOTICES]

    def said(db: str, **flags: bool) -> str:
        quiet_library(False, **flags)
        seen.buffer.clear()
        auth._warn_token_auth_enabled()
        MlflowClient(f"sqlite:///{tmp_path / db}.db").search_experiments()
        return "\n".join(record.getMessage() for record in seen.buffer)

    for logger in loggers:
        logger.addHandler(seen)
    try:
        quiet = said("quiet")
        verbose = said("verbose", verbose=True)
        monkeypatch.setenv("VITPLAST_LOG_LEVEL", "debug")
        by_environment = said("environment")
    finally:
        for logger in loggers:
            logger.removeHandler(seen)
        log.set_verbosity(logging.INFO)
        log.quiet_notices(shown=True)
    assert "Token authentication" not in quiet and "Creating initial MLflow database tables" not in quiet
    for text in (verbose, by_environment):
        assert "Token authentication is enabled" in text and "Creating initial MLflow database tables" in text
