"""A function called in a short-lived Python process, its result returned: what needs torch (checking a model,
decoding a dataset, timing steps) runs there, so a search's driver never holds it."""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from vitplast_tune.errors import UserError


def call_in_child(target: str, *args: Any) -> Any:
    """``module:function(*args)`` run in a short-lived Python process with this one's imports, its result returned
    here (arguments and result pickled through a temporary file). A UserError there is raised here; any other
    failure prints its traceback and raises RuntimeError."""
    with tempfile.TemporaryDirectory(prefix="vitplast-child-") as tmp:
        exchange = Path(tmp) / "call.pkl"  # in: (target, args); out: (ok, result or UserError)
        exchange.write_bytes(pickle.dumps((target, args)))
        code = "import sys; from vitplast_tune.child import _child_main; _child_main(sys.argv[1])"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's imports
        child = subprocess.run([sys.executable, "-c", code, str(exchange)], env=env)
        if child.returncode != 0:
            raise RuntimeError(f"{target} failed in a child process (exit {child.returncode})")
        ok, value = pickle.loads(exchange.read_bytes())
    if not ok:
        raise value
    return value


def _child_main(path: str) -> None:
    """The child of ``call_in_child``: the call pickled in ``path``, its result (or UserError) pickled back there."""
    exchange = Path(path)
    target, args = pickle.loads(exchange.read_bytes())
    module, _, name = target.partition(":")
    try:
        result = (True, getattr(importlib.import_module(module), name)(*args))
    except UserError as exc:
        result = (False, exc)
    exchange.write_bytes(pickle.dumps(result))
