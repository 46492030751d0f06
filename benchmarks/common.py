"""The set-up the benchmarks share.

Their argument parser and ``--json`` result file; ``KEY=VALUE`` settings; scratch directories; small grid
spaces written to a file; a local Ray instance and the SearchOptions of a throw-away search (results and
MLflow in a scratch directory, plasticity off); the search command run as a subprocess; the torch device,
its synchronisation and timing loops; memory figures from /proc; the goal verdicts they print.

torch is imported inside the functions that use it, so the benchmarks that drive a search in their own
process (trial, search) keep that process as free of torch as the search's driver.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from vitplast_tune.components import COMPONENTS

if TYPE_CHECKING:
    import torch

    from vitplast_tune.plan import SearchOptions

ROOT = Path(__file__).resolve().parents[1]  # the repository
SUBSETS = ("all", *COMPONENTS, "head")  # full finetuning, each single component, the head alone


# ----------------------------------------------------------------------------- command line and results


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose help starts with the benchmark's docstring, laid out as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_json_flag(p: argparse.ArgumentParser, help: str = "also write the results to this JSON file") -> None:
    p.add_argument("--json", help=help)


def write_json(path: str | Path | None, result: Any) -> None:
    """Write ``result`` to the ``--json`` file (its folder made when missing), when one was given."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2, default=str) + "\n")


def setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` (a ``--set`` flag) as the key and the value read as YAML."""
    name, _, value = text.partition("=")
    return name.strip(), yaml.safe_load(value)


# ----------------------------------------------------------------------------- a throw-away search


@contextmanager
def scratch(prefix: str, dir: str | None = None) -> Iterator[Path]:
    """A temporary directory, removed after the block."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=dir) as tmp:
        yield Path(tmp)


def grid_space(parameters: dict[str, Any], defaults: dict[str, Any], description: str | None = None) -> dict:
    """A space file's contents: a grid over ``parameters`` (once each, FIFO) maximising val_acc."""
    space = {"description": description} if description else {}
    space.update(metric="val_acc", mode="max", algorithm="grid", num_samples=1, scheduler="fifo")
    return {**space, "parameters": parameters, "defaults": defaults}


def write_space(path: Path, space: dict) -> Path:
    """Write a space file (``space`` as ``grid_space`` makes it, or a loaded one changed) and return its path."""
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def search_options(space: str | Path, directory: Path, **options: Any) -> SearchOptions:
    """SearchOptions of a testbed search with its results and MLflow store in ``directory``, plasticity off."""
    from vitplast_tune.plan import SearchOptions

    defaults = dict(
        storage=str(directory / "results"),
        tracking_uri=f"sqlite:///{directory / 'mlflow.db'}",
        cpus_per_trial=1,
        plasticity=False,
    )
    return SearchOptions(space=str(space), **{**defaults, **options})


@contextmanager
def local_ray(cpus: int, gpus: int | None = None) -> Iterator[None]:
    """A Ray instance of ``cpus`` CPUs (and ``gpus`` GPUs; None: Ray's own count) for the block, quiet; its workers
    import this checkout."""
    import ray

    ray.init(
        address="local",  # an instance of its own, never a cluster another process left in Ray's temp dir
        num_cpus=cpus,
        **({} if gpus is None else {"num_gpus": gpus}),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        # Its workers import this checkout (benchmarks' own trainables), wherever the benchmark was started from.
        runtime_env={
            "env_vars": {"PYTHONWARNINGS": "ignore::DeprecationWarning", "PYTHONPATH": python_env()["PYTHONPATH"]}
        },
    )
    try:
        yield
    finally:
        ray.shutdown()


def python_env(**variables: str) -> dict[str, str]:
    """This process's environment and ``variables``, with the repository first on PYTHONPATH, for a subprocess
    that imports this checkout (``benchmarks``, and ``vitplast_tune`` from the same tree)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **variables, "PYTHONPATH": path}


def search_command(space: Path, storage: str | Path, name: str, *flags: str) -> list[str]:
    """The command line of a quiet search (scripts/search.py) of ``space`` into ``storage``/``name``."""
    script = ROOT / "scripts" / "search.py"
    return [
        sys.executable,
        str(script),
        "--space",
        str(space),
        "--storage",
        str(storage),
        *flags,
        "--quiet",
        "--name",
        name,
    ]


# ----------------------------------------------------------------------------- devices and timing


def pick_device(name: str | None) -> torch.device:
    """``name``, or CUDA when there is a GPU, else the CPU."""
    import torch

    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so that a clock read after it counts that work."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(
    fn: Callable[[int], object],
    device: torch.device,
    warmup: int,
    calls: int,
    after_warmup: Callable[[], object] | None = None,
) -> float:
    """Mean seconds of ``fn(i)`` over ``calls`` timed calls, after ``warmup`` untimed ones (``i`` counts from 0 in each)."""
    for i in range(warmup):
        fn(i)
    sync(device)
    if after_warmup:
        after_warmup()
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    sync(device)
    return (time.perf_counter() - start) / calls


def median_seconds(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int) -> dict[str, float]:
    """Median wall time of each fn over repeats, after a warm-up; the fns take turns so load drift hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for repeat in range(repeats + 1):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            if repeat:  # repeat 0 is the warm-up
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


# ----------------------------------------------------------------------------- memory and verdicts


def kb_field(text: str, key: str) -> int:
    """A ``Key:  N kB`` line of a /proc file (status, smaps_rollup, meminfo) in bytes; 0 when it is absent."""
    match = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) * 1024 if match else 0


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def goal(met: bool, rule: str) -> str:
    """A goal column: ``met (rule)`` or ``MISSED (rule)``."""
    return f"{verdict(met)} ({rule})"
