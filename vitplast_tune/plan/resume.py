"""Resume a search: read its record, rebuild its plan from the recorded settings, and write its resume command."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from vitplast_tune.config import FinetuneConfig, trial_config
from vitplast_tune.errors import ResumeError, UserError, option
from vitplast_tune.plan.options import (
    DEFAULT_MAX_FAILURES,
    DEFAULT_SEED,
    EXPERIMENT,
    SearchOptions,
)
from vitplast_tune.plan.search_plan import Running, SearchPlan
from vitplast_tune.space.files import SearchSpec, spaces_dir
from vitplast_tune.space.finalists import Finalists
from vitplast_tune.space.objectives import with_objective
from vitplast_tune.storage import SEARCH_FILE, read_record

# Settings a resumed search may change: where the data comes from, not what the trials do.
RESUMABLE_SETTINGS = ("download",)
# What trials of a search recorded before ``augment`` existed trained with: the paper's crop + flip on every dataset.
RECORDED_AUGMENTATION = "paper"


def _resume_record(
    spec: SearchSpec, resuming: bool, storage: str, name: str, directory: Path | None
) -> dict[str, Any] | None:
    """Return the record of the search to resume, or None for a new search; refuse a name a recorded search took."""
    if directory is None:
        return None
    if not resuming:
        if (directory / SEARCH_FILE).exists():
            raise ResumeError(
                f'search "{name}" already exists in {storage}; pass {option("resume", True)} to continue it, or another {option("name")}'
            )
        return None
    record = read_record(directory)
    if record["fingerprint"] != spec.fingerprint:
        raise ResumeError(
            f'search "{name}" was started with a different space file ({record["space_path"]}); '
            "resume it with that file, or start a new search with another --name"
        )
    return record


def resumed_plan(
    spec: SearchSpec, options: SearchOptions, running: Running, storage: str, name: str, record: dict
) -> SearchPlan:
    """Rebuild the plan of a resumed search from its record; refuse a flag that would change what it recorded.

    ``--max-failures`` applies to the remaining trials. The flags fixed when a search starts must match the record, and
    MLflow's environment variables do not apply: the search goes on where it started.
    """
    saved = record["settings"]
    stage = Finalists(**record.get("finalists", {}))  # none before the stage existed
    for key, value in options.settings.items():
        if key not in RESUMABLE_SETTINGS and value != saved.get(key):
            _refuse(option(key, value), saved.get(key), name)
    fixed = {
        "num-samples": (options.num_samples, record.get("num_samples", spec.num_samples)),
        "budgets": (_listed(options.budgets), record.get("budgets", _listed(spec.budget_steps))),
        "finalists-top": (options.finalists_top, stage.top),
        "finalists-seeds": (options.finalists_seeds, stage.seeds),
        "max-concurrent": (options.max_concurrent, record.get("max_concurrent")),
        "seed": (options.seed, record.get("seed", DEFAULT_SEED)),
        "tracking-uri": (options.tracking_uri, record["tracking_uri"]),
        "experiment": (options.experiment, record.get("experiment", EXPERIMENT)),
        "objective": (options.objective, record.get("objective", options.objective)),  # unrecorded before 2026-12-06
    }
    for flag, (given, recorded) in fixed.items():
        if given is not None and given != recorded:
            _refuse(option(flag.replace("-", "_"), given), recorded, name)
    workers, started = running.resources.workers, record.get("workers_per_trial")
    if started is not None and workers != started:  # a trial's checkpoint and batch share are its workers'
        raise ResumeError(
            f'search "{name}" was started with {started} worker(s) per trial and this resume would train its trials '
            f"on {workers}; resume with {option('workers_per_trial', started)} (and the resources it ran with: the "
            "command the interrupted search printed has them)"
        )
    spec = replace(spec, num_samples=fixed["num-samples"][1], finalists=stage, baselines=record.get("baselines", 0))
    if options.objective is None and fixed["objective"][1] is not None:  # one study, one objective
        spec = with_objective(spec, fixed["objective"][1])
    if fixed["budgets"][1] is not None:
        spec = spec.with_overrides(budgets=fixed["budgets"][1])
    settings = _recorded_settings(saved, options, name)
    max_failures = (
        record.get("max_failures", DEFAULT_MAX_FAILURES) if options.max_failures is None else options.max_failures
    )
    return SearchPlan(
        spec,
        running,
        name,
        storage,
        record["tracking_uri"],
        settings,
        search_id=record.get("search_id", ""),
        seed=fixed["seed"][1],
        max_failures=max_failures,
        max_concurrent=record.get("max_concurrent"),
        experiment=fixed["experiment"][1],
        corners=tuple(trial_config(c, settings) for c in spec.corner_configs()),
    )


def _recorded_settings(saved: dict[str, Any], options: SearchOptions, name: str) -> FinetuneConfig:
    """Return the trial settings the search recorded, with those a resume may change, validated."""
    changed = {k: options.settings[k] for k in RESUMABLE_SETTINGS if options.settings.get(k) is not None}
    try:
        return FinetuneConfig.from_dict({"augment": RECORDED_AUGMENTATION, **saved, **changed}).validate()
    except UserError as exc:
        raise ResumeError(
            f"{exc} (in the settings recorded in {name}/{SEARCH_FILE}); restore the record, or start a new search "
            "with another --name"
        ) from None


def _refuse(given: str, recorded: Any, name: str) -> None:
    """Refuse a flag whose value differs from the one the search started with."""
    raise ResumeError(
        f'{given} differs from the {recorded!r} search "{name}" was started with, and would make its trials '
        f"inconsistent; resume without it, or start a new search with another {option('name')}"
    )


def _listed(steps) -> list[int] | None:
    return list(steps) if steps else None


def resume_command(plan: SearchPlan) -> str:
    """Write the command that continues an interrupted search.

    Args:
        plan: The search's plan.

    Returns:
        The shell command, with the flags the search ran with that its record does not hold.
    """
    path = Path(plan.spec.path).resolve()
    space = path.stem if path.parent == spaces_dir().resolve() else str(path)  # a shipped space by its name
    words = ["vitplast", "search", "--space", space, "--name", plan.name, "--storage", plan.storage]
    words += plan.running.resume_flags
    return shlex.join([*words, "--resume"])
