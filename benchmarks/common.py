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
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import yaml

from vitplast_tune.components import COMPONENTS, parse_subset
from vitplast_tune.errors import UserError, did_you_mean

if TYPE_CHECKING:
    import torch

    from vitplast_tune.plan import SearchOptions

ROOT = Path(__file__).resolve().parents[1]  # the repository
SUBSETS = ("all", *COMPONENTS, "head")  # full finetuning, each single component, the head alone


# ----------------------------------------------------------------------------- command line and results


class Parser(argparse.ArgumentParser):
    """The benchmarks' argument parser: a mistake is one line and exit code 2, before any work. The flags' types
    below check their values as they are parsed: a count below its floor, a name the benchmark does not know, an
    output file whose folder cannot be written."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def parser(doc: str | None) -> Parser:
    """An argument parser whose help starts with the benchmark's docstring, laid out as written."""
    return Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def at_least(floor: float, kind: type = int) -> Callable[[str], Any]:
    """A flag's type: a number of ``kind`` (int: a whole number; float) not below ``floor`` (nor NaN)."""
    return _number(kind, floor, f"of at least {floor:g}", lambda value: value >= floor)


def above(floor: float, kind: type = float) -> Callable[[str], Any]:
    """A flag's type: a number of ``kind`` above ``floor`` (a rate, a duration, a fraction: above 0)."""
    return _number(kind, floor, f"above {floor:g}", lambda value: value > floor)


def _number(kind: type, floor: float, bound: str, holds: Callable[[Any], bool]) -> Callable[[str], Any]:
    noun = "a whole number" if kind is int else "a number"

    def number(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if math.isnan(value) or not holds(value):
            raise argparse.ArgumentTypeError(f"must be {noun} {bound}, got {text}")
        return value

    return number


def listed(item: Callable[[str], Any]) -> Callable[[str], str]:
    """A flag's type: comma-separated values, each checked by ``item``; the text kept as given."""

    def values(text: str) -> str:
        parts = [part.strip() for part in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"{text!r} has an empty value; separate the values by single commas")
        for part in parts:
            item(part)
        return text

    return values


def known(names: Iterable[str]) -> Callable[[str], str]:
    """A flag's type: one of ``names``, with the closest one as a hint (``listed(known(...))``: comma-separated)."""
    names = list(names)

    def name(text: str) -> str:
        if text not in names:
            same = [n for n in names if n.lower() == text.lower()]  # the name in another case, else the closest
            hint = f' (did you mean "{same[0]}"?)' if same else did_you_mean(text, names)
            raise argparse.ArgumentTypeError(f'unknown "{text}"{hint}; known: {", ".join(names)}')
        return text

    return name


def output(text: str) -> str:
    """A flag's type: a file the benchmark writes at its end, checked now: not a folder, in a folder it can write
    (made if missing); the text kept as given."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; name a file in it")
    _writable_folder(path.parent, text)
    return text


def output_path(text: str) -> Path:
    """``output``, as a path."""
    return Path(output(text))


def folder(text: str) -> str:
    """A flag's type: a folder the benchmark reads (it must be there); the text kept as given."""
    if not Path(text).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder")
    return text


def subset(text: str) -> str:
    """A flag's type: a component subset (``mha``, ``ln1+fc2``, ``all``, ``head``), as ``components`` reads it."""
    try:
        parse_subset(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def output_dir(text: str) -> str:
    """A flag's type: a folder the benchmark writes into, checked now: not a file, writable or makeable."""
    _writable_folder(Path(text).expanduser(), text)
    return text


def _writable_folder(folder: Path, given: str) -> None:
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{given}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{given}: the folder {existing} is not writable")


def add_json_flag(p: argparse.ArgumentParser, help: str = "also write the results to this JSON file") -> None:
    p.add_argument("--json", type=output, help=help)


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
