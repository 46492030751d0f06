"""Running a command in this process as a user would, and what a refused one must show: exit code 2, one line on
stderr, no Ray session started."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from vitplast_tune import cli

SEARCH_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "search.py"


def search_args(space: Path | str, name: str, storage: Path | str, *extra: str) -> list[str]:
    """The arguments of a small test search: ``space`` recorded as ``name`` under ``storage``, no plasticity
    measured, one CPU a trial, then ``extra``."""
    return ["--space", str(space), "--name", name, "--storage", str(storage), "--no-plasticity"] + [
        "--cpus-per-trial",
        "1",
        *extra,
    ]


def search_command(space: Path | str, name: str, storage: Path | str, *extra: str) -> list[str]:
    """``python scripts/search.py`` with ``search_args``, as a subprocess runs it."""
    return [sys.executable, str(SEARCH_SCRIPT), *search_args(space, name, storage, *extra)]


def ray_sessions() -> set[str]:
    """The Ray sessions in this test's own Ray temp dir (conftest gives each test one, and its subprocesses use it)."""
    return {p.name for p in (Path(os.environ["RAY_TMPDIR"]) / "ray").glob("session_*")}


def refused(command: str, argv: list[str], tmp: Path, capsys) -> str:
    """Run ``vitplast-COMMAND argv`` in this process; assert exit code 2 and one line on stderr; return that line."""
    argv = [a.replace("{tmp}", str(tmp)) for a in argv]
    with pytest.raises(SystemExit) as exited:
        cli.COMMANDS[command](argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exited.value.code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert ray_sessions() == set(), "a Ray session was started"
    return lines[0]
