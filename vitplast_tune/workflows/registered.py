"""The pre-registered lab run: the checks, then the labs, exactly as a pre-registration file says (``lab.
preregistration``), in one storage folder, resumable with the same command and ``--resume``.

First each model's candidate tasks are checked in the file's order (``workflows.lab.qualify``, on validation data)
until ``tasks_per_model`` qualify; then the qualifying tasks' labs run, the first of each model, then the second of
each, and so on, so both models have labs early. Every finished check and lab writes its kept records
(``lab.records``) into ``<storage>/kept/lab.<model>.<task>/`` and the run's progress into ``<storage>/registered.json``
(the file's SHA-256 and the git commit it runs at, what finished when); a resume with a changed file is refused.

A run can begin from what an earlier machine kept (``RunSettings.restore_from``, the committed folder beside the
pre-registration): a kept check is read, not trained again, and its lab's later stages are added to its tables; a kept
finished lab is read whole. A kept folder whose model, seeds or space differ from the file's is refused.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitplast_tune import log
from vitplast_tune.errors import UserError
from vitplast_tune.lab.preregistration import Preregistration
from vitplast_tune.lab.progress import RUN_FILE
from vitplast_tune.lab.tasks import LAB_FILE, MODELS, Lab, read_lab_record, write_lab_record
from vitplast_tune.workflows import lab as driver

_log = log.get_logger(__name__)
KEPT = "kept"
RESTORED = "restored"  # <storage>/restored/lab.<model>.<task>/: a check kept on an earlier machine, as it was kept


@dataclass(frozen=True)
class RunSettings:
    """How the registered run's searches run (nothing here changes what it measures).

    Attributes:
        storage: The run's folder (outside any git checkout).
        cpus_per_trial: CPUs per trial.
        verbose: 0 for no progress lines.
        restore_from: A folder of checks (``checks/lab.*``) and labs (``lab.*``) kept on an earlier machine, read
            instead of trained again (None: none).
    """

    storage: Path
    cpus_per_trial: float = 1.0
    verbose: int = 1
    restore_from: Path | None = None


def start_or_resume(prereg: Preregistration, settings: RunSettings, *, resume: bool) -> dict[str, Any]:
    """Check a registered run's storage against the command and write (or read) its record.

    Args:
        prereg: the pre-registration.
        settings: where and how it runs.
        resume: whether the command continues a run.

    Returns:
        The run's record.

    Raises:
        UserError: a new run in a storage that holds one, a resume where none is, or a resume with a changed file.
    """
    path = settings.storage / RUN_FILE
    if path.is_file() and not resume:
        raise UserError(f"{settings.storage} holds a registered run already: --resume continues it")
    if not path.is_file():
        if resume:
            raise UserError(f"--resume: {settings.storage} holds no registered run to continue (no {RUN_FILE})")
        settings.storage.mkdir(parents=True, exist_ok=True)
        record = {"preregistration": prereg.path.name, "sha256": prereg.sha256, "commit": git_commit(), "events": []}
        _event(settings.storage, record, "started")
        return record
    record = json.loads(path.read_text())
    if record.get("sha256") != prereg.sha256:
        raise UserError(
            f"--resume: {prereg.path.name} changed since the run in {settings.storage} started (its SHA-256 was "
            f"{record.get('sha256', '?')[:12]}, now {prereg.sha256[:12]}); a pre-registration is not edited mid-run"
        )
    commit = git_commit()
    if commit != record.get("commit"):
        _log.warning(f"note: the run started at commit {record.get('commit')}; this checkout is {commit} (recorded)")
    _event(settings.storage, record, "resumed", commit=commit)
    return record


def run_registered(
    prereg: Preregistration, settings: RunSettings, *, resume: bool = False, record: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The registered run: every check, then every qualifying task's lab, each kept as it finishes.

    Args:
        prereg: the pre-registration.
        settings: where and how it runs.
        resume: continue the run in ``settings.storage``.
        record: the run's record as ``start_or_resume`` returned it (checked already); None: checked here.

    Returns:
        The run's record at its end.
    """
    if record is None:
        record = start_or_resume(prereg, settings, resume=resume)
    restore_kept(prereg, settings, record)
    qualified: dict[str, list[str]] = {}
    with driver.ray_session():
        for model in prereg.models:
            qualified[model] = check_model(prereg, settings, record, model)
        for rank in range(prereg.tasks_per_model):
            for model in prereg.models:
                if rank < len(qualified[model]):
                    run_one(prereg, settings, record, model, qualified[model][rank])
    _event(settings.storage, record, "finished")
    return record


def make_lab(prereg: Preregistration, settings: RunSettings, model: str, task: str) -> Lab:
    """A lab of the registered run, with the pre-registration's seeds, space, extension rounds and thresholds."""
    return Lab(
        task,
        model,
        settings.storage,
        prereg.space,
        prereg.extension_rounds,
        settings.cpus_per_trial,
        settings.verbose,
        seeds=prereg.seeds,
        saturated=prereg.max_full_val_acc,
        spread_sds=prereg.min_spread_sds,
    )


def check_model(prereg: Preregistration, settings: RunSettings, record: dict[str, Any], model: str) -> list[str]:
    """Check a model's candidate tasks in order until ``tasks_per_model`` qualify; each check kept as it ends.

    Returns:
        The qualifying tasks, in order.
    """
    found: list[str] = []
    for task in prereg.candidate_tasks:
        if len(found) == prereg.tasks_per_model:
            break
        lab = make_lab(prereg, settings, model, task)
        kept = settings.storage / KEPT / lab.name
        if read_lab_record(lab.dir).get("restored"):  # checked on an earlier machine: its recorded qualification
            recorded = read_lab_record(lab.dir)["qualification"]
            qualifies, reason = bool(recorded["qualifies"]), str(recorded["reason"])
        else:
            qualification = driver.qualify(lab)
            qualifies, reason = qualification.qualifies, qualification.reason
            if not (kept / LAB_FILE).is_file():  # lab.json is written last: a check kept whole
                driver.keep(lab, kept)
                _event(settings.storage, record, "checked", lab=lab.name, qualifies=qualifies)
        _say(settings, f"{lab.name}: {reason}")
        if qualifies:
            found.append(task)
    return found


def restore_kept(prereg: Preregistration, settings: RunSettings, record: dict[str, Any]) -> list[str]:
    """Make the checks and labs kept in ``settings.restore_from`` this run's own, once each (nothing trained).

    A kept check is copied to ``<storage>/restored/`` and ``<storage>/kept/`` and its record becomes the lab's (its
    later stages then run and are kept after its tables); a kept finished lab is copied to ``<storage>/kept/`` and its
    record says finished. A lab this run has begun already is left as it is.

    Args:
        prereg: the pre-registration.
        settings: where the run lives and what to restore from.
        record: the run's record (an event ``restored`` is added for each).

    Returns:
        The names of the labs restored by this call.

    Raises:
        UserError: a kept folder of another model, task, seeds or space than the pre-registration's, or without
            its record.
    """
    restored = []
    for name, folder in restorable(prereg, settings.restore_from).items():
        lab_dir, out = settings.storage / name, settings.storage / KEPT / name
        if lab_dir.exists() or out.exists():
            continue
        lab_record = read_lab_record(folder)
        if not lab_record.get("finished"):
            copy = settings.storage / RESTORED / name
            shutil.copytree(folder, copy)
            lab_record["restored"] = {"from": str(folder), "copy": f"{RESTORED}/{name}"}
        write_lab_record(lab_dir, lab_record)
        shutil.copytree(folder, out)
        _event(settings.storage, record, "restored", lab=name, finished=bool(lab_record.get("finished")))
        restored.append(name)
    return restored


def restorable(prereg: Preregistration, source: Path | None) -> dict[str, Path]:
    """The kept checks and labs in ``source`` that a run of ``prereg`` can restore, each checked.

    Args:
        prereg: the pre-registration.
        source: the folder (``checks/lab.*`` and ``lab.*`` inside); None: nothing.

    Returns:
        Lab name -> its kept folder (a finished lab's over its check's).

    Raises:
        UserError: ``source`` is not a folder, or holds a kept folder this pre-registration would not have made.
    """
    if source is None:
        return {}
    if not Path(source).is_dir():
        raise UserError(f"--restore-from: {source} is not a folder")
    kept = {d.name: d for d in sorted(Path(source).glob("checks/lab.*")) if d.is_dir()}
    kept.update({d.name: d for d in sorted(Path(source).glob("lab.*")) if d.is_dir()})
    for name, folder in kept.items():
        _check_restorable(prereg, name, folder)
    return kept


def _check_restorable(prereg: Preregistration, name: str, folder: Path) -> None:
    """Refuse a kept folder that this pre-registration would not have made."""
    lab_record = read_lab_record(folder)
    parts = name.split(".", 2)
    where = f"--restore-from: {folder}"
    if not lab_record or "qualification" not in lab_record:
        raise UserError(f"{where} holds no kept check ({LAB_FILE} with a qualification): not a kept lab folder")
    if len(parts) != 3 or parts[1] not in prereg.models or parts[2] not in prereg.candidate_tasks:
        raise UserError(f"{where}: {name} is not a lab of this pre-registration's models and tasks")
    differs = {
        "model": (lab_record.get("model"), MODELS[parts[1]]),
        "seeds": (lab_record.get("seeds"), list(prereg.seeds)),
        "space": (lab_record.get("space"), prereg.space),
    }
    for what, (was, wanted) in differs.items():
        if was != wanted:
            raise UserError(f"{where}: its {what} is {was}, the pre-registration's {wanted}: it cannot be restored")


def run_one(prereg: Preregistration, settings: RunSettings, record: dict[str, Any], model: str, task: str) -> None:
    """One qualifying task's lab: its other subsets, then its kept records (once: a kept ``lab.json`` that says
    finished)."""
    lab = make_lab(prereg, settings, model, task)
    if not read_lab_record(lab.dir).get("finished"):
        _say(settings, f"{lab.name}: the lab's other subsets")
        driver.run_rest(lab)
        lab_record = read_lab_record(lab.dir)
        lab_record.update(
            finished=time.strftime("%Y-%m-%dT%H:%M:%S"), commit=record.get("commit"), seeds=list(lab.seeds)
        )
        lab_record["preregistration_sha256"] = prereg.sha256
        write_lab_record(lab.dir, lab_record)
    kept = settings.storage / KEPT / lab.name
    if not read_lab_record(kept).get("finished"):
        driver.keep(lab, kept)
        _event(settings.storage, record, "lab finished", lab=lab.name)


def git_commit() -> str | None:
    """The git commit of the checkout this package runs from (None outside a git checkout)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def _event(storage: Path, record: dict[str, Any], what: str, **about: Any) -> None:
    """Add an event (what, when, about) to the run's record and write it whole."""
    record.setdefault("events", []).append({"event": what, "at": time.strftime("%Y-%m-%dT%H:%M:%S"), **about})
    path = storage / RUN_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def _say(settings: RunSettings, text: str) -> None:
    if settings.verbose:
        _log.info(text)


def describe_run(record: dict[str, Any]) -> str:
    """A registered run's record as text: its file, commit and every event.

    Args:
        record: the run's record (``registered.json``).

    Returns:
        The text.
    """
    lines = [
        f"Registered run of {record.get('preregistration')} (sha256 {str(record.get('sha256'))[:12]}, commit "
        f"{str(record.get('commit'))[:12]}):"
    ]
    for e in record.get("events", []):
        about = ", ".join(f"{k} {v}" for k, v in e.items() if k not in ("event", "at"))
        lines.append(f"  {e['at']}  {e['event']}{': ' + about if about else ''}")
    return "\n".join(lines)
