"""Read Ray Tune internals (from Ray 2.60.0): OptunaSearch's study, a restored Tuner's run config, and trial state."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any


def optuna_study(searcher) -> Any:
    """Return the Optuna study an ``OptunaSearch`` asks and tells."""
    return searcher._ot_study


def optuna_trials(searcher) -> dict[str, Any]:
    """Return the live Optuna trial of each Tune trial an ``OptunaSearch`` suggested and has not ended."""
    return searcher._ot_trials


def completed_trials(searcher) -> set[str]:
    """Return the Tune trial ids an ``OptunaSearch`` has already told Optuna about."""
    return searcher._completed_trials


def renew_run_config(restored, renew: Callable[[Any], Any]) -> None:
    """Apply ``renew`` to a restored Tuner's run config, here or in a Ray Client's Tuner actor."""
    if getattr(restored, "_local_tuner", None) is not None:
        renew(restored._local_tuner.get_run_config())
        return
    import ray

    remote = restored._remote_tuner
    ray.get(remote.set_run_config_and_remote_string_queue.remote(renew(ray.get(remote.get_run_config.remote())), None))


# The loggers whose records report, with the exception attached, that Tune's save of its experiment state failed
# (which Tune logs instead of raising) or that a trial failed; and Ray's syncer, whose record of a failed upload
# holds the traceback as text.
FAILURE_LOGGERS = (
    "ray.tune.execution.experiment_state",
    "ray.tune.tune",
    "ray.tune.execution.tune_controller",
    "ray.train._internal.syncer",
)

# The logger of Tune's ``ExperimentAnalysis``, which warns of each trial with no results to read (one that had not
# reported when its search stopped), as a restored Tuner reads the experiment.
EXPERIMENT_ANALYSIS_LOGGER = "ray.tune.analysis.experiment_analysis"


# Tune writes each state file of a save to ".<uuid4>-tmp-<name>" beside it, then renames it (``_atomic_save``,
# ``Searcher.save_to_dir``), while the upload of the previous save may still be listing and copying that folder.
_TEMPORARY_STATE_FILE = re.compile(r"/\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-tmp-[^/']+'")


def renamed_while_uploaded(error: BaseException | str | None) -> bool:
    """Tell whether an upload of Tune's state failed only because the next save renamed a file."""
    if isinstance(error, BaseException):
        return isinstance(error, FileNotFoundError) and _TEMPORARY_STATE_FILE.search(str(error)) is not None
    return isinstance(error, str) and "FileNotFoundError" in error and _TEMPORARY_STATE_FILE.search(error) is not None


def experiment_paths(trial) -> tuple[Path, tuple[Any, str]]:
    """Return where a trial's experiment keeps its state: the driver's staging folder and the storage."""
    storage = trial.storage
    return Path(storage.experiment_driver_staging_path), (storage.storage_filesystem, storage.experiment_fs_path)


def trial_error_text(trial) -> str:
    """Return the text of a trial's latest failure, or "" when it has none."""
    path = trial.error_file
    try:
        text = Path(path).read_text(errors="replace") if path else ""
    except OSError:
        return ""
    return text.rsplit("Failure # ", 1)[-1]
