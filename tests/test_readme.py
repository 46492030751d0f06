"""The README's first steps work as written: its quickstart command (run here at a few trials and steps: the flags
below are appended to it, nothing else changed) names the search that its next lines open by that name: `vitplast ui
quickstart`, the Python lines (the best model, the search's records), `vitplast status quickstart` and `vitplast
list`. The commands are read from the README, so a change there is what runs. The quickstart runs in a
pseudo-terminal nobody sized, as a newcomer's terminal under `script` or a harness is: its progress bar shows, and no
notice of Ray's or MLflow's comes before its first progress line."""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _raycluster import OwnedRay

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SMALL = ["--num-samples", "2", "--max-steps", "8", "--no-plasticity"]  # a laptop's minute, not its hour
NOTICES = ("Token authentication", "Creating initial MLflow database tables", "INFO")  # Ray's and MLflow's at start


def quickstart_command() -> list[str]:
    """The README's quickstart command, after its install step."""
    block = re.findall(r"```bash\n(.*?)```", README.split("## Quickstart", 1)[1], re.S)[0]
    command = block.strip().split("&&")[-1]
    return shlex.split(command)


def python_lines() -> str:
    """The README's first Python block."""
    return re.findall(r"```python\n(.*?)```", README, re.S)[0]


def inline_commands(prefix: str) -> list[list[str]]:
    """Every inline `vitplast ...` command of the README that starts with ``prefix``."""
    return [shlex.split(c) for c in re.findall(r"`(vitplast [^`]+)`", README) if c.startswith(prefix)]


def in_terminal(command: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run ``command`` with a new pseudo-terminal (its size unset, 0 x 0) as stdin, stdout and stderr; its exit code and
    everything it wrote."""
    import os
    import select

    main, follower = os.openpty()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    written, deadline = b"", time.time() + timeout
    try:
        while time.time() < deadline:
            if select.select([main], [], [], 1.0)[0]:
                try:
                    chunk = os.read(main, 1 << 16)
                except OSError:  # EIO: the command ended and closed the terminal
                    break
                if not chunk:
                    break
                written += chunk
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(timeout=60), written.decode(errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readmes_quickstart_and_its_next_lines_work_as_written(tmp_path):
    command = quickstart_command()
    assert command[:2] == ["python", "scripts/search.py"] and "--name" in command
    name = command[command.index("--name") + 1]
    owned = OwnedRay()
    try:
        code, shown = in_terminal([sys.executable, *command[1:], *SMALL], owned.env, timeout=900)
    finally:
        owned.kill_all()
    lines = shown.replace("\r\n", "\n").split("\n")
    assert code == 0, shown[-3000:]
    assert any(line.startswith("Answer: finetune ") for line in lines) and f"Search {name}: 2 trials" in shown
    assert "Configuration for experiment" not in shown  # Ray Tune's banner silenced
    first = shown.index("1/2 trials done")  # the first progress line
    assert [n for n in NOTICES if n in shown[:first]] == [], shown[:first]  # quiet until then (issue 57)
    assert "\rtrials 1/2 |" in shown and "elapsed, best " in shown  # the bar, with the best so far

    (ui,) = inline_commands(f"vitplast ui {name}")
    port = free_port()
    serving = subprocess.Popen(
        [sys.executable, "-m", "vitplast_tune", *ui[1:], "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines, deadline = [], time.time() + 180
        while time.time() < deadline and not any("MLflow UI on http://" in line for line in lines):
            line = serving.stdout.readline()
            if not line and serving.poll() is not None:
                break
            lines.append(line)
        assert any(f"MLflow UI on http://127.0.0.1:{port}" in line for line in lines), "".join(lines)
    finally:
        serving.terminate()
        serving.wait(timeout=60)

    code = python_lines() + "print(type(model).__name__, search.status, len(search.trials), search.name)\n"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split()[-3:] == ["finished", "2", name]

    for words in (inline_commands(f"vitplast status {name}")[0], inline_commands("vitplast list")[0]):
        proc = subprocess.run([sys.executable, "-m", "vitplast_tune", *words[1:]], capture_output=True, text=True)
        assert proc.returncode == 0 and name in proc.stdout and "finished" in proc.stdout, proc.stderr
