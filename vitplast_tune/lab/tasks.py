"""Name the criteria lab's tasks and models, and keep each lab's folder and its ``lab.json`` record."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitplast_tune.components import BLOCK_COMPONENTS
from vitplast_tune.config import TESTBED_MODEL, TESTBED_SEED1_MODEL
from vitplast_tune.errors import UserError, did_you_mean
from vitplast_tune.storage import default_storage

CORRUPTIONS = (  # each of data/corruptions.py's corruptions makes a task on digits and on the novel fractals
    "contrast", "gaussian_noise", "motion_blur", "snow", "speckle_noise",
    "shot_noise", "impulse_noise", "defocus_blur", "pixelate", "jpeg_compression",
    "fog", "glass_blur", "zoom_blur", "gaussian_blur",
)  # fmt: skip
TASKS: dict[str, str] = {  # maps a task's folder name to its dataset
    "digits": "digits",
    **{f"digits_c-{c}": f"digits_c:{c}" for c in CORRUPTIONS},
    "fractals_novel": "fractals_novel",
    **{f"fractals_novel_c-{c}": f"fractals_novel_c:{c}" for c in CORRUPTIONS},
}
MODELS: dict[str, str] = {"s0": TESTBED_MODEL, "s1": TESTBED_SEED1_MODEL}  # maps a short name to a timm name
DEFAULT_SPACE = "criteria_lab"
MAX_ROUNDS = 2  # extension rounds beyond the grid's rates
FULL, SINGLES = ("all",), (*BLOCK_COMPONENTS, "head")
SATURATED = 0.95  # full finetuning at or above this validation accuracy saturates the task
SPREAD_SDS = 3.0  # the best and worst single components must differ by this many seed standard deviations
LAB_FILE = "lab.json"


@dataclass
class Lab:
    """Name one task's lab on one model, where it lives and how its searches run.

    Attributes:
        task: The task, a key of ``TASKS``.
        model: The model's short name, a key of ``MODELS``.
        storage: The folder holding the lab's folder.
        space: The lab space's name or file.
        max_rounds: Extension rounds beyond the grid's rates.
        cpus_per_trial: CPUs per trial.
        verbose: 0 for no progress lines.
        seeds: The seeds every configuration trains with, or None for the lab space's.
        saturated: The check's threshold on full finetuning's mean validation accuracy.
        spread_sds: The check's threshold on the single components' spread, in seed standard deviations.
    """

    task: str
    model: str = "s0"
    storage: Path = field(default_factory=default_storage)
    space: str = DEFAULT_SPACE
    max_rounds: int = MAX_ROUNDS
    cpus_per_trial: float = 1.0
    verbose: int = 1
    seeds: tuple[int, ...] | None = None
    saturated: float = SATURATED
    spread_sds: float = SPREAD_SDS

    def __post_init__(self) -> None:
        self.storage = Path(self.storage).expanduser().resolve()
        if self.task not in TASKS:
            raise UserError(f'unknown task "{self.task}"{did_you_mean(self.task, TASKS)}; tasks: {", ".join(TASKS)}')
        if self.model not in MODELS:
            raise UserError(
                f'unknown model "{self.model}"; models: {", ".join(f"{k} ({v})" for k, v in MODELS.items())}'
            )
        if self.max_rounds < 0:
            raise UserError(f"--max-rounds must not be negative, not {self.max_rounds}")
        if self.seeds is not None:
            self.seeds = tuple(int(s) for s in self.seeds)
            if len(set(self.seeds)) < 3:
                raise UserError(f"a lab needs at least 3 different seeds, not {list(self.seeds)}")

    @property
    def name(self) -> str:
        """Return the lab's folder name, ``lab.<model>.<task>``."""
        return f"lab.{self.model}.{self.task}"

    @property
    def dir(self) -> Path:
        """Return the lab's folder, which holds one search per stage and ``lab.json``."""
        return self.storage / self.name

    @property
    def settings(self) -> dict[str, Any]:
        """Return the model and dataset that every trial of the lab trains."""
        return {"model": MODELS[self.model], "dataset": TASKS[self.task]}

    @property
    def tracking_uri(self) -> str:
        """Return the storage's one MLflow store, which holds every lab's runs."""
        return f"sqlite:///{self.storage / 'mlflow.db'}"


def read_lab_record(directory: Path) -> dict[str, Any]:
    """Read a lab's record ``lab.json``, which is empty before the first stage finished."""
    path = Path(directory) / LAB_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_lab_record(directory: Path, record: dict[str, Any]) -> None:
    """Write a lab's record ``lab.json`` whole, through a temporary file."""
    path = Path(directory) / LAB_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def record_stage(
    lab: Lab, stage: str, components: list[str], lrs: list[float] | None, *, seconds: float, trials: int
) -> None:
    """Add a finished stage with its configurations, rates, trials and wall seconds to the lab's record."""
    record = read_lab_record(lab.dir)
    from vitplast_tune.space.files import load_space

    record.update(lab=lab.name, task=lab.task, dataset=TASKS[lab.task], model=MODELS[lab.model], space=lab.space)
    record["space_fingerprint"] = load_space(lab.space).fingerprint  # a resume with another space is refused
    if lab.seeds is not None:
        record["seeds"] = list(lab.seeds)
    record.setdefault("stages", {})[stage] = {
        "components": list(components),
        "lrs": lrs,
        "trials": trials,
        "seconds": round(seconds, 1),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    write_lab_record(lab.dir, record)


def lab_minutes(lab: Lab) -> tuple[float, int]:
    """Return the recorded wall minutes of a lab's finished stages and their number."""
    stages = read_lab_record(lab.dir).get("stages", {})
    return sum(s["seconds"] for s in stages.values()) / 60, len(stages)
