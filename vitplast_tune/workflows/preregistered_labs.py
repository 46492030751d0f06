"""Run the checks and labs that a pre-registration file names, in one storage folder that a resume continues."""

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
RESTORED = "restored"  # this folder holds the checks that an earlier machine kept, unchanged


@dataclass(frozen=True)
class RunSettings:
    """Say how the registered run's searches run, without changing what they measure.

    Attributes:
        storage: The run's folder, outside any git checkout.
        cpus_per_trial: CPUs per trial.
        verbose: 0 for no progress lines.
        restore_from: A folder of checks and labs that an earlier machine kept, read instead of trained again.
    """

    storage: Path
    cpus_per_trial: float = 1.0
    verbose: int = 1
    restore_from: Path | None = None


def start_or_resume(prereg: Preregistration, settings: RunSettings, *, resume: bool) -> dict[str, Any]:
    """Check the run's storage against the command, then write a new record or read the one to resume.

    Raises:
        UserError: If a new run meets an old one, a resume finds none, or the file changed since the run started.
    """
    path = settings.storage / RUN_FILE
    if path.is_file() and not resume:
        raise UserError(f"{settings.storage} holds a registered run already: --resume continues it")
    if not path.is_file():
        if resume:
            raise UserError(f"--resume: {settings.storage} holds no registered run to continue (no {RUN_FILE})")
        settings.storage.mkdir(parents=True, exist_ok=True)
        record = {"preregistration": prereg.path.name, "sha256": prereg.sha256, "commit": _git_commit(), "events": []}
        _event(settings.storage, record, "started")
        return record
    record = json.loads(path.read_text())
    if record.get("sha256") != prereg.sha256:
        raise UserError(
            f"--resume: {prereg.path.name} changed since the run in {settings.storage} started (its SHA-256 was "
            f"{record.get('sha256', '?')[:12]}, now {prereg.sha256[:12]}); a pre-registration is not edited mid-run"
        )
    commit = _git_commit()
    if commit != record.get("commit"):
        _log.warning(f"note: the run started at commit {record.get('commit')}; this checkout is {commit} (recorded)")
    _event(settings.storage, record, "resumed", commit=commit)
    return record


def run_registered(
    prereg: Preregistration, settings: RunSettings, *, resume: bool = False, record: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run every check, then every qualifying task's lab, and keep each as it finishes.

    Args:
        prereg: The pre-registration.
        settings: Where and how the run goes.
        resume: Whether to continue the run in ``settings.storage``.
        record: The record that ``start_or_resume`` returned, or None to check the storage here.

    Returns:
        The run's record at its end.
    """
    if record is None:
        record = start_or_resume(prereg, settings, resume=resume)
    _restore_kept(prereg, settings, record)
    qualified: dict[str, list[str]] = {}
    with driver.ray_session():
        for model in prereg.models:
            qualified[model] = check_model(prereg, settings, record, model)
        for rank in range(prereg.tasks_per_model):  # one task of each model per round: both models have labs early
            for model in prereg.models:
                if rank < len(qualified[model]):
                    _run_one(prereg, settings, record, model, qualified[model][rank])
    _event(settings.storage, record, "finished")
    return record


def _make_lab(prereg: Preregistration, settings: RunSettings, model: str, task: str) -> Lab:
    """Build a lab with the pre-registration's seeds, space, extension rounds and thresholds."""
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
    """Check a model's candidate tasks in order until enough qualify, and return those tasks."""
    found: list[str] = []
    for task in prereg.candidate_tasks:
        if len(found) == prereg.tasks_per_model:
            break
        lab = _make_lab(prereg, settings, model, task)
        kept = settings.storage / KEPT / lab.name
        if read_lab_record(lab.dir).get("restored"):  # an earlier machine checked it
            recorded = read_lab_record(lab.dir)["qualification"]
            qualifies, reason = bool(recorded["qualifies"]), str(recorded["reason"])
        else:
            qualification = driver.qualify(lab)
            qualifies, reason = qualification.qualifies, qualification.reason
            if not (kept / LAB_FILE).is_file():  # lab.json is written last, so its presence means the check is whole
                driver.keep(lab, kept)
                _event(settings.storage, record, "checked", lab=lab.name, qualifies=qualifies)
        _say(settings, f"{lab.name}: {reason}")
        if qualifies:
            found.append(task)
    return found


def _restore_kept(prereg: Preregistration, settings: RunSettings, record: dict[str, Any]) -> None:
    """Copy the checks and labs kept in ``settings.restore_from`` into this run, leaving labs it has begun alone.

    A restored check's later stages run here and are kept after its tables. A restored finished lab is read whole.
    """
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


def restorable(prereg: Preregistration, source: Path | None) -> dict[str, Path]:
    """Find the kept checks and labs in ``source`` that this run may restore, by lab name.

    A finished lab's folder wins over its check's.

    Raises:
        UserError: If ``source`` is not a folder or holds a kept folder that this pre-registration would not make.
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
    """Refuse a kept folder that this pre-registration would not make."""
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


def _run_one(prereg: Preregistration, settings: RunSettings, record: dict[str, Any], model: str, task: str) -> None:
    """Train a qualifying task's other subsets, then keep the lab's records once."""
    lab = _make_lab(prereg, settings, model, task)
    if not read_lab_record(lab.dir).get("finished"):
        _say(settings, f"{lab.name}: the lab's other subsets")
        driver._run_rest(lab)
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


def _git_commit() -> str | None:
    """Return the git commit that this package runs from, or None outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def _event(storage: Path, record: dict[str, Any], what: str, **about: Any) -> None:
    """Add an event to the run's record and write the record whole."""
    record.setdefault("events", []).append({"event": what, "at": time.strftime("%Y-%m-%dT%H:%M:%S"), **about})
    path = storage / RUN_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def _say(settings: RunSettings, text: str) -> None:
    if settings.verbose:
        _log.info(text)


def describe_run(record: dict[str, Any]) -> str:
    """Describe a registered run's file, commit and events as text."""
    lines = [
        f"Registered run of {record.get('preregistration')} (sha256 {str(record.get('sha256'))[:12]}, commit "
        f"{str(record.get('commit'))[:12]}):"
    ]
    for e in record.get("events", []):
        about = ", ".join(f"{k} {v}" for k, v in e.items() if k not in ("event", "at"))
        lines.append(f"  {e['at']}  {e['event']}{': ' + about if about else ''}")
    return "\n".join(lines)
