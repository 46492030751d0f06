"""Ray Tune internals (read from Ray 2.60.0): ``OptunaSearch``'s live Optuna study and trials, a restored
``Tuner``'s run config (Ray restores the pickled callbacks and failure budget, with no public way to renew them),
where a trial's experiment keeps its state, a trial's error text, the loggers that report failed saves of the
experiment state (Tune logs them instead of raising) and failed trials, and the temporary files of those saves.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any


def optuna_study(searcher) -> Any:
    """The Optuna study an ``OptunaSearch`` asks and tells (``_ot_study``)."""
    return searcher._ot_study


def optuna_trials(searcher) -> dict[str, Any]:
    """The live Optuna trial of each Tune trial id an ``OptunaSearch`` suggested and has not ended (``_ot_trials``)."""
    return searcher._ot_trials


def completed_trials(searcher) -> set[str]:
    """The Tune trial ids an ``OptunaSearch`` has already told Optuna about (``_completed_trials``)."""
    return searcher._completed_trials


def renew_run_config(restored, renew: Callable[[Any], Any]) -> None:
    """Apply ``renew(run_config) -> run_config`` to a restored Tuner's run config: in this process (``_local_tuner``),
    or in the Tuner actor of a Ray Client (ray://) driver (``_remote_tuner``)."""
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
    """Whether ``error`` (an exception, or a traceback's text) is an upload of Tune's state that listed a temporary
    file of the next save and found it renamed before it opened it: the state is whole, and Tune starts the next
    upload as it reports the failed one."""
    if isinstance(error, BaseException):
        return isinstance(error, FileNotFoundError) and _TEMPORARY_STATE_FILE.search(str(error)) is not None
    return isinstance(error, str) and "FileNotFoundError" in error and _TEMPORARY_STATE_FILE.search(error) is not None


def experiment_paths(trial) -> tuple[Path, tuple[Any, str]]:
    """Where a trial's experiment keeps its state: the driver's staging folder (Tune writes its state files there
    first, then uploads them) and (the storage's pyarrow filesystem, the experiment's path in it)."""
    storage = trial.storage
    return Path(storage.experiment_driver_staging_path), (storage.storage_filesystem, storage.experiment_fs_path)


def trial_error_text(trial) -> str:
    """The text of a trial's latest failure (its error file on the driver), or "" when it has none."""
    path = trial.error_file
    try:
        text = Path(path).read_text(errors="replace") if path else ""
    except OSError:
        return ""
    return text.rsplit("Failure # ", 1)[-1]
