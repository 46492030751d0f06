"""The state a resumed search continues from, checked before Ray starts: Tune's experiment state and its pickles (the
Tuner, the searcher, the search generator, the callbacks), the checkpoint each unfinished trial restarts from, and
the search's Optuna study. A file cut short or corrupt is one ``UserError`` naming it and what the user can do, instead
of a traceback (or a hang) after Ray started with the MLflow runs reopened.

Cheap whatever the search's size: pickles are read opcode by opcode (nothing is unpickled, nothing imported), a
checkpoint's zip directory and safetensors header are read (not its tensors), a SQLite file's header.
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
# Tune's other state files: the searcher's (and its wrappers'), the variant generator's, the callbacks'; each is a
# pickle, whatever its suffix; what resuming without it does.
STATE_PICKLES = {
    "searcher-state-*.pkl": "the searcher",
    "search_gen_state-*.json": "the search generator",
    "basic-variant-state-*.json": "the variant generator",
    "callback-states-*.pkl": "the callbacks",
}
CALLBACKS = "callback-states-*.pkl"
SEARCHER_STATE = "searcher-state-*.pkl"  # TPE's own (its study)
GENERATOR_STATE = "search_gen_state-*.json"  # how many trials were sampled, the experiment they belong to
VARIANT_STATE = "basic-variant-state-*.json"
FINISHED = "TERMINATED"


def check_resume_state(directory: Path, record: dict[str, Any]) -> None:
    """UserError naming the first file of search ``directory``'s state that is cut short or corrupt."""
    trials = _check_experiment(directory)
    for pattern, what in STATE_PICKLES.items():
        newest = max(directory.glob(pattern), default=None)
        problem = newest and pickle_problem(newest)
        if problem:
            raise ResumeError(_advice(newest, problem, what, pattern))
    for trial_id, checkpoint in trials:
        _check_checkpoint(directory, trial_id, checkpoint)
    _check_study(directory, record)


def _check_experiment(directory: Path) -> list[tuple[str, str]]:
    """Tune's experiment state and Tuner must be whole; return (trial id, checkpoint folder) of each trial that a
    resume restarts from a checkpoint."""
    start_anew = "restore it from a backup, or start the search anew with another --name (its MLflow runs stay)"
    tuner = directory / TUNER_FILE
    problem = tuner.is_file() and pickle_problem(tuner)
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


def pickle_problem(path: Path) -> str | None:
    """What is wrong with the pickle ``path`` ("cut short", "corrupt", "unreadable"), or None: its opcodes read to
    the end, nothing unpickled."""
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


def check_generator_state(directory: Path, algorithm: str) -> str | None:
    """UserError when Tune's folder holds trials but not the state of the generator that samples the rest (a new one
    would sample none, or repeat the grid); a note when only TPE's own state is missing (a new TPE takes over)."""
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
    """The checkpoint trial ``trial_id`` restarts from must be whole (its state and best weights)."""
    folder = directory / f"trial_{trial_id}" / checkpoint
    for name, check in ((STATE_FILE, zip_problem), (BEST_FILE, safetensors_problem)):
        path = folder / name
        problem = path.is_file() and check(path)
        if problem:
            raise ResumeError(
                f"the checkpoint trial {trial_id} resumes from, {path}, is {problem}: restore it from a backup, or "
                "start the search anew with another --name (a resume would fail that trial again and again)"
            )


def zip_problem(path: Path) -> str | None:
    """What is wrong with the zip file ``path`` (torch's checkpoint format), or None: its directory read and each
    member's bytes within the file (no member decompressed)."""
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if member.header_offset + member.compress_size > size:
                    return f"cut short ({member.filename} ends past the file)"
    except (OSError, zipfile.BadZipFile) as exc:
        return f"cut short or corrupt ({exc})"
    return None


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with the safetensors file ``path``, or None: its header read and its length checked against the
    tensors it declares."""
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
    """The search's Optuna study, where its record names one (``study_storage``), else its SQLite file, must open."""
    url = record.get("study_storage") or (
        f"sqlite:///{directory / STUDY_FILE}" if (directory / STUDY_FILE).is_file() else None
    )
    if url is None:
        return
    problem = study_problem(url)
    if problem:
        raise ResumeError(
            f"the search's Optuna study {url} does not open ({problem}): move it aside and --resume again (the study "
            "is written anew from the trials), or restore it from a backup"
        )


def study_problem(url: str) -> str | None:
    """What keeps the Optuna storage ``url`` from opening, or None: a SQLite file's header and length, then its
    tables read (none made)."""
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
