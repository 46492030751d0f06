"""Read and check a pre-registration file, or an amendment that adds candidate tasks to one."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from vitplast_tune.errors import UserError
from vitplast_tune.lab.tasks import MODELS, TASKS

KEYS = (  # the file must have every key; docs/results/data/README.md says what each means
    "registered",
    "models",
    "candidate_tasks",
    "tasks_per_model",
    "qualification",
    "seeds",
    "seed_values",
    "space",
    "extension_rounds",
    "predictors",
    "baseline",
    "statistic",
    "resampling",
    "alpha",
    "margin",
    "correction",
    "undecided_mc_se",
    "family",
    "headline",
)
QUALIFICATION_KEYS = ("max_full_val_acc", "min_single_component_seed_sds")
AMENDMENT_KEYS = ("amends", "amends_sha256", "registered", "reason", "candidate_tasks_added")


@dataclass(frozen=True)
class Preregistration:
    """Hold a checked pre-registration: the design the runner follows, and the rest as written.

    Attributes:
        path: The file.
        sha256: The SHA-256 of its bytes.
        models: The models' short names, in the file's order.
        candidate_tasks: The tasks, in the order they are checked.
        tasks_per_model: How many must qualify per model.
        max_full_val_acc: The check's saturation threshold on validation accuracy.
        min_spread_sds: The check's spread threshold, in seed standard deviations.
        seeds: The seed values.
        space: The lab space.
        extension_rounds: Extension rounds beyond the grid's rates.
        raw: The whole file as read. An amendment adds itself under ``amendment``.
        amends: The pre-registration an amendment amends, or None.
    """

    path: Path
    sha256: str
    models: tuple[str, ...]
    candidate_tasks: tuple[str, ...]
    tasks_per_model: int
    max_full_val_acc: float
    min_spread_sds: float
    seeds: tuple[int, ...]
    space: str
    extension_rounds: int
    raw: dict[str, Any]
    amends: Preregistration | None = None


def read_preregistration(path: str | Path) -> Preregistration:
    """Read and check a pre-registration file.

    Args:
        path: The YAML file.

    Returns:
        The checked pre-registration.

    Raises:
        UserError: If the file is missing, is not YAML, lacks a key, or names what the lab does not know.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"pre-registration {path} not found")
    text = path.read_bytes()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"pre-registration {path} is not YAML: {str(exc).splitlines()[0]}") from None
    where = f"pre-registration {path}"
    if not isinstance(raw, dict):
        raise UserError(f"{where}: not a mapping of keys")
    if "amends" in raw:
        return _amended(path, text, raw)
    missing = [k for k in KEYS if k not in raw]
    if missing:
        raise UserError(f"{where}: missing key(s) {', '.join(missing)}")
    models = _models(raw["models"], where)
    tasks = [str(t) for t in raw["candidate_tasks"] or []]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks or len(set(tasks)) != len(tasks):
        raise UserError(f"{where}: candidate_tasks must be distinct known tasks ({', '.join(TASKS)}), not {tasks}")
    quality = raw["qualification"] or {}
    if not isinstance(quality, dict) or any(k not in quality for k in QUALIFICATION_KEYS):
        raise UserError(f"{where}: qualification needs {', '.join(QUALIFICATION_KEYS)}")
    seeds = tuple(int(s) for s in raw["seed_values"] or [])
    if len(seeds) != raw["seeds"] or len(set(seeds)) != len(seeds) or len(seeds) < 3:
        raise UserError(f"{where}: seeds ({raw['seeds']}) must count the distinct seed_values {list(seeds)} (>= 3)")
    per_model = raw["tasks_per_model"]
    if not isinstance(per_model, int) or not 1 <= per_model <= len(tasks):
        raise UserError(f"{where}: tasks_per_model must be between 1 and {len(tasks)}, not {per_model}")
    return Preregistration(
        path=path.resolve(),
        sha256=hashlib.sha256(text).hexdigest(),
        models=models,
        candidate_tasks=tuple(tasks),
        tasks_per_model=per_model,
        max_full_val_acc=float(quality["max_full_val_acc"]),
        min_spread_sds=float(quality["min_single_component_seed_sds"]),
        seeds=seeds,
        space=str(raw["space"]),
        extension_rounds=_count(raw["extension_rounds"], "extension_rounds", where),
        raw=raw,
    )


def _amended(path: Path, text: bytes, raw: dict[str, Any]) -> Preregistration:
    """Read an amendment as the pre-registration it amends, with its candidate tasks added."""
    where = f"amendment {path}"
    missing = [k for k in AMENDMENT_KEYS if k not in raw]
    if missing:
        raise UserError(f"{where}: missing key(s) {', '.join(missing)}")
    extra = [k for k in raw if k not in AMENDMENT_KEYS]
    if extra:
        raise UserError(f"{where}: an amendment adds candidate tasks only, not {', '.join(extra)}")
    base = read_preregistration(path.parent / str(raw["amends"]))
    if base.amends is not None:
        raise UserError(f"{where}: it amends {raw['amends']}, itself an amendment: amend the pre-registration")
    if raw["amends_sha256"] != base.sha256:
        raise UserError(
            f"{where}: {raw['amends']} is not the file it amends (SHA-256 {base.sha256[:12]}, the amendment names "
            f"{str(raw['amends_sha256'])[:12]})"
        )
    added = [str(t) for t in raw["candidate_tasks_added"] or []]
    unknown = [t for t in added if t not in TASKS]
    again = [t for t in added if t in base.candidate_tasks]
    if unknown or again or not added or len(set(added)) != len(added):
        raise UserError(
            f"{where}: candidate_tasks_added must be distinct known tasks not in {raw['amends']} "
            f"(unknown: {unknown or 'none'}; already there: {again or 'none'})"
        )
    return replace(
        base,
        path=path.resolve(),
        sha256=hashlib.sha256(text).hexdigest(),
        candidate_tasks=(*base.candidate_tasks, *added),
        raw={**base.raw, "amendment": raw},
        amends=base,
    )


def _count(value: Any, key: str, where: str) -> int:
    """Check that a count is a whole number, 0 or more."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UserError(f"{where}: {key} must be a whole number >= 0, not {value!r}")
    return value


def _models(models: Any, where: str) -> tuple[str, ...]:
    """Check the file's models against the lab's and return their short names."""
    if not isinstance(models, dict) or not models:
        raise UserError(f"{where}: models must map short names to timm names, e.g. {{s0: {MODELS['s0']}}}")
    for short, timm_name in models.items():
        if MODELS.get(short) != timm_name:
            known = ", ".join(f"{k}: {v}" for k, v in MODELS.items())
            raise UserError(f"{where}: model {short}: {timm_name} is not one the lab knows ({known})")
    return tuple(models)
