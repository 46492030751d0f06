"""Check the state a resumed search continues from, before Ray starts: Tune's files, the checkpoints and the study.

A file cut short or corrupt is one ``UserError`` that names it and says what to do. The checks read headers and
pickle opcodes only, so they cost little whatever the search's size.
"""

from __future__ import annotations

import json
import pickletools
import struct
import zipfile
from pathlib import Path
from typing import Any

from vitplast_tune.errors import ResumeError
from vitplast_tune.plan import services
from vitplast_tune.storage import BEST_FILE, STATE_FILE, STUDY_FILE

EXPERIMENT_STATE = "experiment_state-*.json"  # Tune's trials and their statuses, newest by name
TUNER_FILE = "tuner.pkl"
SEARCHER_STATE = "searcher-state-*.pkl"  # TPE's own, with its study
GENERATOR_STATE = "search_gen_state-*.json"  # how many trials were sampled
VARIANT_STATE = "basic-variant-state-*.json"
CALLBACKS = "callback-states-*.pkl"
# Tune's other state files, each a pickle whatever its suffix, and what each holds.
STATE_PICKLES = {
    SEARCHER_STATE: "the searcher",
    GENERATOR_STATE: "the search generator",
    VARIANT_STATE: "the variant generator",
    CALLBACKS: "the callbacks",
}
FINISHED = "TERMINATED"


def _check_resume_state(directory: Path, record: dict[str, Any]) -> None:
    """Raise UserError naming the first file of the search's state that is cut short or corrupt."""
    trials = _check_experiment(directory)
    for pattern, what in STATE_PICKLES.items():
        newest = max(directory.glob(pattern), default=None)
        problem = newest and _pickle_problem(newest)
        if problem:
            raise ResumeError(_advice(newest, problem, what, pattern))
    for trial_id, checkpoint in trials:
        _check_checkpoint(directory, trial_id, checkpoint)
    _check_study(directory, record)


def _check_experiment(directory: Path) -> list[tuple[str, str]]:
    """Check Tune's experiment state and Tuner; return the unfinished trials with their checkpoints."""
    start_anew = "restore it from a backup, or start the search anew with another --name (its MLflow runs stay)"
    tuner = directory / TUNER_FILE
    problem = tuner.is_file() and _pickle_problem(tuner)
    if problem:
        raise ResumeError(f"Tune's Tuner {tuner} is {problem}: the search cannot be resumed from it; {start_anew}")
    newest = max(directory.glob(EXPERIMENT_STATE), default=None)
    if newest is None:
        return []
    try:
        state = json.loads(newest.read_text())
        trial_data = state["trial_data"]
        rows = [
            (json.loads(t) if isinstance(t, str) else t, json.loads(m) if isinstance(m, str) else m)
            for t, m in trial_data
        ]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ResumeError(
            f"Tune's experiment state {newest} is cut short or corrupt ({str(exc).splitlines()[0][:120]}): the "
            f"search cannot be resumed from it; {start_anew}"
        ) from None
    restarts = []
    for trial, metadata in rows:
        checkpoint = ((metadata or {}).get("last_result") or {}).get("checkpoint_dir_name")
        if trial.get("status") != FINISHED and checkpoint:
            restarts.append((str(trial.get("trial_id")), checkpoint))
    return restarts


def _pickle_problem(path: Path) -> str | None:
    """Say what is wrong with a pickle, reading its opcodes without unpickling it; None when it is whole."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if not data:
        return "empty"
    try:
        for _ in pickletools.genops(data):
            pass
    except ValueError as exc:
        cut = any(words in str(exc) for words in ("exhausted", "truncated", "remain"))
        return "cut short" if cut else f"corrupt ({exc})"
    except Exception as exc:  # a pickle's opcodes read as another type: any error of genops means corrupt
        return f"corrupt ({type(exc).__name__})"
    return None


def _advice(path: Path, problem: str, what: str, pattern: str) -> str:
    """Say what the user can do about a damaged state file."""
    if pattern == CALLBACKS:
        fix = "move it aside and --resume again (the callbacks start afresh: the trials' MLflow runs are found by tag)"
    elif pattern == SEARCHER_STATE:
        fix = (
            "move it aside and --resume again (a new TPE then samples the trials not sampled yet, without the earlier "
            "trials' results), restore it from a backup, or start the search anew with another --name"
        )
    else:
        fix = (
            "restore it from a backup, or start the search anew with another --name (the trials done stay in MLflow "
            "and in Tune's folder)"
        )
    return f"the state of {what} in Tune's folder, {path}, is {problem}: {fix}"


def _check_generator_state(directory: Path, algorithm: str) -> str | None:
    """Refuse a Tune folder with trials but no generator state; note when only TPE's state is missing."""
    if max(directory.glob(EXPERIMENT_STATE), default=None) is None:
        return None
    generator = GENERATOR_STATE if algorithm == "optuna" else VARIANT_STATE
    if not any(directory.glob(generator)):
        raise ResumeError(
            f"the state of the search's generator ({generator}) is missing from Tune's folder {directory}: without "
            "it the trials not sampled yet would never be; restore it from a backup, or start the search anew with "
            "another --name"
        )
    if algorithm == "optuna" and not any(directory.glob(SEARCHER_STATE)):
        return f"TPE's state ({SEARCHER_STATE}) is not in {directory}: a new TPE samples the trials not sampled yet"
    return None


def _check_checkpoint(directory: Path, trial_id: str, checkpoint: str) -> None:
    """Check the checkpoint a trial restarts from: its state and its best weights."""
    folder = directory / f"trial_{trial_id}" / checkpoint
    for name, check in ((STATE_FILE, _zip_problem), (BEST_FILE, _safetensors_problem)):
        path = folder / name
        problem = path.is_file() and check(path)
        if problem:
            raise ResumeError(
                f"the checkpoint trial {trial_id} resumes from, {path}, is {problem}: restore it from a backup, or "
                "start the search anew with another --name (a resume would fail that trial again and again)"
            )


def _zip_problem(path: Path) -> str | None:
    """Say what is wrong with a zip file, reading its directory only; None when it is whole."""
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if member.header_offset + member.compress_size > size:
                    return f"cut short ({member.filename} ends past the file)"
    except (OSError, zipfile.BadZipFile) as exc:
        return f"cut short or corrupt ({exc})"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """Say what is wrong with a safetensors file, from its header and length; None when it is whole."""
    try:
        with open(path, "rb") as f:
            length = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(length))
        size = path.stat().st_size
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as exc:
        return f"cut short or corrupt ({str(exc)[:80]})"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    if 8 + length + max(ends, default=0) > size:
        return f"cut short ({size:,} of {8 + length + max(ends):,} bytes)"
    return None


def _check_study(directory: Path, record: dict[str, Any]) -> None:
    """Check that the search's Optuna study opens."""
    url = record.get("study_storage") or (
        f"sqlite:///{directory / STUDY_FILE}" if (directory / STUDY_FILE).is_file() else None
    )
    if url is None:
        return
    problem = _study_problem(url)
    if problem:
        raise ResumeError(
            f"the search's Optuna study {url} does not open ({problem}): move it aside and --resume again (the study "
            "is written anew from the trials), or restore it from a backup"
        )


def _study_problem(url: str) -> str | None:
    """Say what keeps an Optuna storage from opening, making no tables; None when it opens."""
    if url.startswith("sqlite:///"):
        problem = services.sqlite_problem(Path(url.split(":///", 1)[1].split("?")[0]))
        if problem:
            return problem
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    try:
        optuna.storages.RDBStorage(url, skip_table_creation=True).get_all_studies()
    except (SQLAlchemyError, optuna.exceptions.OptunaError, OSError, ValueError, RuntimeError) as exc:
        return str(exc).splitlines()[0][:160]
    return None
