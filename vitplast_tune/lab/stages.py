"""The stage spaces of a lab: the lab space's grid (``search_spaces/criteria_lab.yaml``) split into stages, each a
search of its own: ``full`` (full finetuning), ``single`` (each block component alone, and the linear probe), ``rest``
(every other subset), and the extension searches ``<stage>.ext<k>.lr<rate>`` (one rate beyond an end of the grid)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vitplast_tune.components import subset_name
from vitplast_tune.errors import UserError
from vitplast_tune.lab.tasks import FULL, LAB_FILE, MODELS, SINGLES, TASKS, Lab, read_lab_record


def base_space(space: str) -> tuple[dict[str, Any], list[str], list[float]]:
    """The lab space's raw YAML, its subsets and its learning rates.

    Args:
        space: a space name or file.

    Returns:
        (raw YAML, subset names, rates).

    Raises:
        UserError: unless it is a fifo grid with a choice of subsets, of at least 3 rates and 3 seeds, and no budgets.
    """
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
    """The configurations of each main stage.

    Args:
        lab: the lab.

    Returns:
        ``{"full": [...], "single": [...], "rest": [...]}`` (``rest``: the lab space's other subsets).
    """
    _, components, _ = base_space(lab.space)
    rest = [c for c in components if c not in (*FULL, *SINGLES)]
    return {"full": list(FULL), "single": list(SINGLES), "rest": rest}


def stage_space(lab: Lab, stage: str, components: list[str], lrs: list[float] | None = None) -> Path:
    """The space file of one stage, written once into the lab's ``spaces/`` folder.

    Args:
        lab: the lab (its ``seeds``, when set, replace the space's).
        stage: the stage's name.
        components: its configurations.
        lrs: its rates (None: the space's).

    Returns:
        The path of the lab space with subsets, rates and seeds narrowed and no analysis of its own.
    """
    path, text = lab.dir / "spaces" / f"{stage}.yaml", stage_text(lab, stage, components, lrs)
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def stage_text(lab: Lab, stage: str, components: list[str], lrs: list[float] | None = None) -> str:
    """The text of a stage's space file (``stage_space``), made without writing it."""
    raw, _, _ = base_space(lab.space)
    raw = dict(raw, criteria=False, description=f"{lab.name}, stage {stage}: {len(components)} configuration(s)")
    raw["parameters"] = dict(raw["parameters"], components={"choice": list(components)})
    if lrs is not None:
        raw["parameters"]["lr"] = {"choice": [float(r) for r in lrs]}
    if lab.seeds is not None:
        raw["parameters"]["seed"] = {"choice": list(lab.seeds)}
    return yaml.safe_dump(raw, sort_keys=False)


def check_lab(lab: Lab) -> None:
    """Check, before Ray starts and before anything is written, that a lab can run and goes on as it started.

    Args:
        lab: the lab (its folder may hold a record ``lab.json`` of the stages run so far).

    Raises:
        UserError: for CPUs per trial that are not positive, a lab space that is not a lab's grid (``base_space``), or
            a space, seeds, model or task that differ from those its record names, or a started stage whose
            recorded space differs from the one it would run now (its stages would mix two designs).
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
    else:  # a record of before the fingerprint: the space's name or file
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
    """Each main stage whose search started (its record ``<stage>/vitplast_search.json``, also before ``lab.json``
    exists) must have started with the stage space the lab would run now (its file in ``spaces/``, never rewritten
    then): the same subsets, rates and seeds."""
    from vitplast_tune.storage import SEARCH_FILE

    for stage, components in stage_components(lab).items():
        path = lab.dir / "spaces" / f"{stage}.yaml"
        if not (lab.dir / stage / SEARCH_FILE).is_file() or not path.is_file():
            continue
        if path.read_text() != stage_text(lab, stage, components):
            raise UserError(
                f"{lab.name} in {lab.storage}: its stage {stage} was started with another space than --space "
                f"{lab.space} gives now (other subsets, rates or seeds than spaces/{stage}.yaml): its stages would "
                "mix two designs; run it as it started, or give another --storage for a new lab"
            )
