"""Running a command in this process as a user would, and what a refused one must show: exit code 2, one line on
stderr, no Ray session started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vitplast_tune import cli


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
