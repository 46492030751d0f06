"""Split a lab space's grid into the stage searches full, single and rest, and check a lab before it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vitplast_tune.components import subset_name
from vitplast_tune.errors import UserError
from vitplast_tune.lab.tasks import FULL, LAB_FILE, MODELS, SINGLES, TASKS, Lab, read_lab_record


def base_space(space: str) -> tuple[dict[str, Any], list[str], list[float]]:
    """Read the lab space's raw YAML, subsets and rates, refusing all but a fifo grid with 3 rates and 3 seeds."""
    from vitplast_tune.space.files import load_space

    spec = load_space(space)
    raw = yaml.safe_load(Path(spec.path).read_text())
    where = f"lab space {spec.path}"
    if spec.algorithm != "grid" or spec.scheduler.name != "fifo" or spec.budgets:
        raise UserError(f"{where}: a lab needs algorithm: grid, scheduler: fifo and one budget (no budgets)")
    params = spec.parameters
    for name, least in (("components", 1), ("lr", 3), ("seed", 3)):
        values = params[name].grid_values() if name in params else []
        if len(values) < least:
            raise UserError(f"{where}: a lab needs {name} as a choice of at least {least} values, not {values}")
    return raw, [subset_name(c) for c in params["components"].grid_values()], list(params["lr"].grid_values())


def stage_components(lab: Lab) -> dict[str, list[str]]:
    """Return the configurations of the stages full, single and rest, the last holding every other subset."""
    _, components, _ = base_space(lab.space)
    rest = [c for c in components if c not in (*FULL, *SINGLES)]
    return {"full": list(FULL), "single": list(SINGLES), "rest": rest}


def stage_space(lab: Lab, stage: str, components: list[str], lrs: list[float] | None = None) -> Path:
    """Write one stage's space file into the lab's ``spaces/`` folder, narrowing subsets, rates and seeds."""
    path, text = lab.dir / "spaces" / f"{stage}.yaml", _stage_text(lab, stage, components, lrs)
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def _stage_text(lab: Lab, stage: str, components: list[str], lrs: list[float] | None = None) -> str:
    """Return the text of a stage's space file without writing it."""
    raw, _, _ = base_space(lab.space)
    raw = dict(raw, criteria=False, description=f"{lab.name}, stage {stage}: {len(components)} configuration(s)")
    raw["parameters"] = dict(raw["parameters"], components={"choice": list(components)})
    if lrs is not None:
        raw["parameters"]["lr"] = {"choice": [float(r) for r in lrs]}
    if lab.seeds is not None:
        raw["parameters"]["seed"] = {"choice": list(lab.seeds)}
    return yaml.safe_dump(raw, sort_keys=False)


def check_lab(lab: Lab) -> None:
    """Check that a lab can run and goes on as it started, before Ray starts and before anything is written.

    Raises:
        UserError: If the lab would mix two designs, or its settings or space are invalid.
    """
    if not lab.cpus_per_trial > 0:
        raise UserError(f"--cpus-per-trial must be positive, got {lab.cpus_per_trial:g}")
    base_space(lab.space)
    _check_started_stages(lab)
    record = read_lab_record(lab.dir)
    if not record:
        return
    from vitplast_tune.space.files import load_space

    given = {
        "model": MODELS[lab.model],
        "dataset": TASKS[lab.task],
        "seeds": None if lab.seeds is None else list(lab.seeds),
    }
    spec = load_space(lab.space)
    if "space_fingerprint" in record:
        same_space = record["space_fingerprint"] == spec.fingerprint
    else:  # an older record names the space instead of its fingerprint
        same_space = record.get("space") in (None, lab.space, str(spec.path), Path(spec.path).stem)
    differences = [("--space", record.get("space"), lab.space)] if not same_space else []
    differences += [(key, record[key], value) for key, value in given.items() if key in record and record[key] != value]
    if differences:
        what, recorded, value = differences[0]
        raise UserError(
            f"{lab.name} in {lab.storage} was started with {what} {recorded} ({LAB_FILE}), not {value}: its stages "
            f"would mix two designs; run it as it started, or give another --storage for a new lab"
        )


def _check_started_stages(lab: Lab) -> None:
    """Refuse a started stage whose space file differs from the one the lab would run now."""
    from vitplast_tune.storage import SEARCH_FILE

    for stage, components in stage_components(lab).items():
        path = lab.dir / "spaces" / f"{stage}.yaml"
        if not (lab.dir / stage / SEARCH_FILE).is_file() or not path.is_file():
            continue
        if path.read_text() != _stage_text(lab, stage, components):
            raise UserError(
                f"{lab.name} in {lab.storage}: its stage {stage} was started with another space than --space "
                f"{lab.space} gives now (other subsets, rates or seeds than spaces/{stage}.yaml): its stages would "
                "mix two designs; run it as it started, or give another --storage for a new lab"
            )
