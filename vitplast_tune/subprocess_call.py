"""Call a function in a short-lived Python process, so a search's driver never imports torch."""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vitplast_tune.errors import UserError

_sessions: list[_Child] = []  # the child processes of the open sessions, the innermost last


def call_in_child(target: str, *args: Any, timeout_s: float | None = None) -> Any:
    """Run ``module:function(*args)`` in a short-lived Python process and return its result.

    The arguments and the result must pickle. Inside a ``session`` without ``timeout_s`` the call uses the session's
    process; ``timeout_s`` None sets no limit. A UserError raised in the child is raised here; another failure is a
    RuntimeError (its traceback printed), and a child still running after ``timeout_s`` is killed (TimeoutError).
    """
    with tempfile.TemporaryDirectory(prefix="vitplast-child-") as tmp:
        exchange = Path(tmp) / "call.pkl"  # holds (target, args), then (ok, result or UserError)
        exchange.write_bytes(pickle.dumps((target, args)))
        if _sessions and timeout_s is None:
            returncode = _sessions[-1].call(exchange)
        else:
            code = "import sys; from vitplast_tune.subprocess_call import _child_main; _child_main(sys.argv[1])"
            try:
                child = subprocess.run([sys.executable, "-c", code, str(exchange)], env=_env(), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"{target} took more than {timeout_s:g} s in a child process") from None
            returncode = child.returncode
        if returncode != 0:
            raise RuntimeError(f"{target} failed in a child process (exit {returncode})")
        ok, value = pickle.loads(exchange.read_bytes())
    if not ok:
        raise value
    return value


@contextlib.contextmanager
def session() -> Iterator[None]:
    """Let the block's ``call_in_child`` calls share one child process, which imports torch once."""
    child = _Child()
    _sessions.append(child)
    try:
        yield
    finally:
        _sessions.remove(child)
        child.close()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's imports


class _Child:
    """Run the calls sent down one pipe in a child process, and signal each end up another."""

    def __init__(self):
        calls, self._calls = os.pipe()
        self._ends, ends = os.pipe()
        code = (
            "import sys; from vitplast_tune.subprocess_call import _serve; _serve(int(sys.argv[1]), int(sys.argv[2]))"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(calls), str(ends)], env=_env(), pass_fds=(calls, ends)
        )
        os.close(calls)
        os.close(ends)

    def call(self, exchange: Path) -> int:
        """Run the call in ``exchange``; return 0 once it has ended, else the child's exit code."""
        os.write(self._calls, f"{exchange}\n".encode())
        done = os.read(self._ends, 1)
        return 0 if done == b"." else self.proc.wait()

    def close(self) -> None:
        os.close(self._calls)  # the child's loop ends with its input
        self.proc.wait()
        os.close(self._ends)


def _serve(calls: int, ends: int) -> None:
    """Serve a session: run each exchange file named on ``calls``, then write a dot on ``ends``."""
    with os.fdopen(calls) as lines:
        for line in lines:
            _child_main(line.strip())
            os.write(ends, b".")


def _child_main(path: str) -> None:
    """Run the call pickled in ``path`` and pickle its result, or its UserError, back there."""
    exchange = Path(path)
    target, args = pickle.loads(exchange.read_bytes())
    module, _, name = target.partition(":")
    try:
        result = (True, getattr(importlib.import_module(module), name)(*args))
    except UserError as exc:
        result = (False, exc)
    exchange.write_bytes(pickle.dumps(result))
