"""The criteria lab on offline tasks, end to end and resumable: each task's lab as a few grid searches under one folder,
its grid extended where a configuration's best rate lies at an end of the rates it was trained at, the check that a
task is worth a lab (not saturated, single components apart), and the verdict pooled across labs.

A lab, ``<storage>/lab.<model>.<task>/``, splits the lab space's grid (``search_spaces/criteria_lab.yaml``) into
stages, each a search of its own in that folder: ``full`` (full finetuning), ``single`` (each block component alone,
and the linear probe), ``rest`` (every other subset of the space). After each stage come rounds of extension searches
``<stage>.ext<k>.lr<rate>``: the configurations whose best mean validation accuracy lies at an end of their rates,
trained at the next rate beyond it (``analysis.bracket``), at most ``max_rounds`` times; those still at an end are
marked and left out of the verdict. A stage whose trial table exists is done, one with a record and no table is
resumed, so the same command run again goes on where it stopped. The lab's own analysis (``analysis.lab``) reads every
stage's trials; ``pooled`` judges the labs together (``analysis.pooled``).

Driver side: no torch at import; Ray and the search driver are imported where a stage runs. The command is
``vitplast lab`` (``cli/lab.py``); this module sits above ``workflows`` (it runs searches and times them as a dry run).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from vitplast_tune import log
from vitplast_tune.analysis import bracket
from vitplast_tune.analysis.protocol import best_lr_table
from vitplast_tune.components import BLOCK_COMPONENTS, subset_name
from vitplast_tune.config import TESTBED_MODEL, TESTBED_SEED1_MODEL
from vitplast_tune.errors import UserError, did_you_mean
from vitplast_tune.storage import SEARCH_FILE, default_storage

_log = log.get_logger(__name__)

CORRUPTIONS = ("contrast", "gaussian_noise", "motion_blur", "snow", "speckle_noise")
TASKS: dict[str, str] = {  # task name (a folder name) -> dataset
    "digits": "digits",
    **{f"digits_c-{c}": f"digits_c:{c}" for c in CORRUPTIONS},
    "fractals_novel": "fractals_novel",
    **{f"fractals_novel_c-{c}": f"fractals_novel_c:{c}" for c in CORRUPTIONS},
}
MODELS: dict[str, str] = {"s0": TESTBED_MODEL, "s1": TESTBED_SEED1_MODEL}  # short name -> timm name
DEFAULT_SPACE = "criteria_lab"
FULL, SINGLES = ("all",), (*BLOCK_COMPONENTS, "head")
SATURATED = 0.95  # full finetuning's test accuracy at or above this: the task is saturated
SPREAD_SDS = 3.0  # the best and worst single components must differ by this many seed standard deviations
LAB_FILE = "lab.json"


@dataclass
class Lab:
    """One task's lab: where it lives and how its searches run."""

    task: str
    model: str = "s0"
    storage: Path = field(default_factory=default_storage)
    space: str = DEFAULT_SPACE
    max_rounds: int = 2
    cpus_per_trial: float = 1.0
    verbose: int = 1

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

    @property
    def name(self) -> str:
        """The lab's folder name: ``lab.<model>.<task>``."""
        return f"lab.{self.model}.{self.task}"

    @property
    def dir(self) -> Path:
        return self.storage / self.name

    @property
    def settings(self) -> dict[str, Any]:
        """What every trial of the lab trains: the model and the dataset (the space's defaults otherwise)."""
        return {"model": MODELS[self.model], "dataset": TASKS[self.task]}

    @property
    def tracking_uri(self) -> str:
        """Every lab's runs in the storage's one MLflow store."""
        return f"sqlite:///{self.storage / 'mlflow.db'}"


def base_space(space: str) -> tuple[dict[str, Any], list[str], list[float]]:
    """The lab space's raw YAML, its subsets and its learning rates; UserError unless it is a fifo grid with a choice
    of subsets, of rates (at least 3) and of at least 3 seeds, and no budgets."""
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


def stage_space(lab: Lab, stage: str, components: list[str], lrs: list[float] | None = None) -> Path:
    """The space file of one stage: the lab space with its subsets (and, for an extension, its rate) narrowed and no
    analysis of its own; written once into the lab's ``spaces/`` folder."""
    raw, _, _ = base_space(lab.space)
    raw = dict(raw, criteria=False, description=f"{lab.name}, stage {stage}: {len(components)} configuration(s)")
    raw["parameters"] = dict(raw["parameters"], components={"choice": list(components)})
    if lrs is not None:
        raw["parameters"]["lr"] = {"choice": [float(r) for r in lrs]}
    path = lab.dir / "spaces" / f"{stage}.yaml"
    text = yaml.safe_dump(raw, sort_keys=False)
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def run_stage(lab: Lab, stage: str, components: list[str], lrs: list[float] | None = None) -> pd.DataFrame:
    """One stage's trials: read when its search finished, else run (a new search, or the interrupted one resumed) and
    its wall time recorded in the lab's record."""
    from vitplast_tune.plan.options import SearchOptions
    from vitplast_tune.records.table import read_trials
    from vitplast_tune.run import driver

    directory = lab.dir / stage
    if (directory / "trials.csv").is_file():
        return read_trials(directory)
    space = stage_space(lab, stage, components, lrs)
    options = SearchOptions(
        space=str(space),
        name=stage,
        storage=str(lab.dir),
        tracking_uri=lab.tracking_uri,
        settings=lab.settings,
        resume=(directory / SEARCH_FILE).is_file(),
        cpus_per_trial=lab.cpus_per_trial,
        verbose=lab.verbose,
    )
    _say(lab, f"[{lab.name}] stage {stage}: {len(components)} configuration(s){'' if lrs is None else f' at lr {lrs}'}")
    started = time.perf_counter()
    found = driver.run(options)
    record_stage(lab, stage, components, lrs, time.perf_counter() - started, len(found.trials))
    return found.trials


def record_stage(lab: Lab, stage: str, components: list[str], lrs, seconds: float, trials: int) -> None:
    """Add a finished stage (its configurations, rates, trials and wall seconds) to the lab's record ``lab.json``."""
    record = read_lab_record(lab.dir)
    record.update(lab=lab.name, task=lab.task, dataset=TASKS[lab.task], model=MODELS[lab.model], space=lab.space)
    record.setdefault("stages", {})[stage] = {
        "components": list(components),
        "lrs": lrs,
        "trials": trials,
        "seconds": round(seconds, 1),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    write_lab_record(lab.dir, record)


def read_lab_record(directory: Path) -> dict[str, Any]:
    """A lab's record (empty before its first stage finished)."""
    path = Path(directory) / LAB_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_lab_record(directory: Path, record: dict[str, Any]) -> None:
    path = Path(directory) / LAB_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def bracketed_stage(lab: Lab, stage: str, components: list[str]) -> pd.DataFrame:
    """A stage and its extension rounds: after the stage, every configuration whose best rate is at an end of its rates
    is trained at the next one (one search per rate), at most ``lab.max_rounds`` rounds; their trials together."""
    parts = [run_stage(lab, stage, components)]
    for round_ in range(1, lab.max_rounds + 1):
        trials = pd.concat(parts, ignore_index=True)
        groups = bracket.extension_groups(bracket.bracket_table(trials))
        if not groups:
            break
        for lr, configs in groups.items():
            parts.append(run_stage(lab, f"{stage}.ext{round_}.lr{lr:g}", configs, [lr]))
    return pd.concat(parts, ignore_index=True)


@contextlib.contextmanager
def ray_session():
    """One local Ray instance for every stage search run inside (each search joins it instead of starting its own),
    shut down after; nothing when Ray is running already."""
    import ray

    from vitplast_tune.run import cluster

    if ray.is_initialized():
        yield
        return
    cluster.init(None)
    try:
        yield
    finally:
        ray.shutdown()


def _say(lab: Lab, text: str) -> None:
    if lab.verbose:
        _log.info(text)


# ----------------------------------------------------------------------------- is the task worth a lab?


@dataclass
class Qualification:
    """Is a task worth a lab on a model? Full finetuning's test accuracy at its best rate, and the spread of the single
    components at theirs, in seed standard deviations."""

    lab: str
    task: str
    model: str
    full: dict[str, Any]  # lr, mean, std, n_seeds, position of full finetuning
    singles: pd.DataFrame  # each block component alone at its best rate
    best: str = ""
    worst: str = ""
    spread: float = math.nan  # best minus worst single component's mean test accuracy
    seed_sd: float = math.nan  # their pooled seed standard deviation, sqrt((sd_best^2 + sd_worst^2) / 2)
    qualifies: bool = False
    reason: str = ""

    @property
    def in_sds(self) -> float:
        """The spread in seed standard deviations."""
        return self.spread / self.seed_sd if self.seed_sd > 0 else math.inf if self.spread > 0 else math.nan


def at_best_rate(trials: pd.DataFrame, components: list[str]) -> pd.DataFrame:
    """Each of ``components`` at its best rate (mean validation accuracy over seeds): lr, mean and std of the test
    accuracy over seeds, seeds, and where the rate lies among those it was trained at."""
    table = best_lr_table(trials, "test_acc", select_by="best_val_acc").set_index("components")
    positions = bracket.bracket_table(trials).set_index("components")["position"]
    table = table.reindex([c for c in components if c in table.index])
    return table.assign(position=positions.reindex(table.index))[["lr", "mean", "std", "n_seeds", "position"]]


def qualify(lab: Lab) -> Qualification:
    """Run (or read) the lab's ``full`` and ``single`` stages with their extensions and judge the task: it qualifies when
    full finetuning stays below ``SATURATED`` and the best and worst single block components differ by at least
    ``SPREAD_SDS`` seed standard deviations. A saturated task's single components are not trained."""
    full = at_best_rate(bracketed_stage(lab, "full", list(FULL)), list(FULL)).iloc[0].to_dict()
    found = Qualification(lab.name, lab.task, lab.model, full, pd.DataFrame())
    if full["mean"] >= SATURATED:
        found.reason = f"saturated: full finetuning reaches {100 * full['mean']:.2f}% >= {100 * SATURATED:g}%"
        return _record_qualification(lab, found)
    singles = at_best_rate(bracketed_stage(lab, "single", list(SINGLES)), list(BLOCK_COMPONENTS))
    found.singles = singles
    best, worst = singles["mean"].idxmax(), singles["mean"].idxmin()
    found.best, found.worst = best, worst
    found.spread = float(singles.loc[best, "mean"] - singles.loc[worst, "mean"])
    found.seed_sd = float(np.sqrt((singles.loc[best, "std"] ** 2 + singles.loc[worst, "std"] ** 2) / 2))
    found.qualifies = bool(found.in_sds >= SPREAD_SDS)
    found.reason = "qualifies" if found.qualifies else f"single components within {SPREAD_SDS:g} seed SDs"
    return _record_qualification(lab, found)


def _record_qualification(lab: Lab, found: Qualification) -> Qualification:
    record = read_lab_record(lab.dir)
    record["qualification"] = {
        "full": {
            k: (float(v) if isinstance(v, (int, float, np.floating, np.integer)) else v) for k, v in found.full.items()
        },
        "best": found.best,
        "worst": found.worst,
        "spread": found.spread,
        "seed_sd": found.seed_sd,
        "qualifies": found.qualifies,
        "reason": found.reason,
    }
    write_lab_record(lab.dir, record)
    return found


def describe_qualifications(found: list[Qualification]) -> str:
    """The check of every task: full finetuning's test accuracy, the single components' spread and its size in seed
    standard deviations, and whether the task qualifies."""
    rows = []
    for q in found:
        f = q.full
        spread = (
            f"{q.best} {100 * q.singles.loc[q.best, 'mean']:.2f}% - {q.worst} {100 * q.singles.loc[q.worst, 'mean']:.2f}%"
            f" = {100 * q.spread:.2f} pts, seed sd {100 * q.seed_sd:.2f}"
            if q.best
            else "not trained (saturated)"
        )
        rows.append(
            {
                "task": q.task,
                "model": q.model,
                "full finetuning test acc": f"{100 * f['mean']:.2f} ± {100 * f['std']:.2f}% (lr {f['lr']:g}, {f['position']})",
                "best - worst single component": spread,
                "SDs": "" if not q.best else f"{q.in_sds:.1f}",
                "verdict": q.reason,
            }
        )
    head = (
        f"Does each task qualify for the lab? Full finetuning below {100 * SATURATED:g}% test accuracy and the best and "
        f"worst single block components at least {SPREAD_SDS:g} seed standard deviations apart (each at its best rate, "
        "mean ± std over seeds):"
    )
    with pd.option_context("display.width", 250, "display.max_colwidth", 80):
        table = pd.DataFrame(rows).to_string(index=False)
    qualified = [q.task + f" ({q.model})" for q in found if q.qualifies]
    return f"{head}\n{table}\n  -> {len(qualified)} of {len(found)} qualify: {', '.join(qualified) or 'none'}"


# ----------------------------------------------------------------------------- the lab


def run_lab(lab: Lab, *, even_if_unqualified: bool = False):
    """The whole lab on its task: the qualification stages, then (when it qualifies, or ``even_if_unqualified``) the
    other subsets with their extensions, then the lab's analysis; returns (qualification, lab results or None)."""
    found = qualify(lab)
    _say(lab, describe_qualifications([found]))
    if not (found.qualifies or even_if_unqualified):
        return found, None
    _, components, _ = base_space(lab.space)
    rest = [c for c in components if c not in (*FULL, *SINGLES)]
    if rest:
        bracketed_stage(lab, "rest", rest)
    return found, analyze_lab(lab)


def lab_trials(lab: Lab) -> pd.DataFrame:
    """Every finished stage's trials, together (a ``stage`` column says whose)."""
    from vitplast_tune.records.table import read_trials

    parts = [
        read_trials(d).assign(stage=d.name)
        for d in sorted(lab.dir.iterdir())
        if d.is_dir() and (d / "trials.csv").is_file()
    ]
    if not parts:
        raise UserError(f"lab {lab.name} in {lab.storage} has no finished stage yet: run vitplast lab run {lab.task}")
    return pd.concat(parts, ignore_index=True)


def analyze_lab(lab: Lab, *, n_boot: int | None = None):
    """The lab's analysis over every stage's trials (``analysis.lab.criteria_lab``, with in-network plasticity measured
    or read from its cache), written to ``<lab>/analysis``; returns its results."""
    from vitplast_tune.analysis import lab as criteria
    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.predictors.report import in_network_scores
    from vitplast_tune.storage import read_record

    trials = lab_trials(lab)
    settings = FinetuneConfig.from_dict(read_record(lab.dir / "full", purpose="recorded")["settings"])
    extra = in_network_scores(settings, trials["components"].unique())
    _, _, grid = base_space(lab.space)
    results = criteria.criteria_lab({None: trials}, extra, grid_lrs=grid, n_boot=n_boot or criteria.N_BOOT)
    out = lab.dir / "analysis"
    criteria.write_lab(results, out)
    trials.to_csv(out / "lab_trials.csv", index=False)
    return results


def lab_minutes(lab: Lab) -> tuple[float, int]:
    """The wall minutes of a lab's finished stages (as recorded when each finished) and their number."""
    stages = read_lab_record(lab.dir).get("stages", {})
    return sum(s["seconds"] for s in stages.values()) / 60, len(stages)


# ----------------------------------------------------------------------------- how long it takes


@dataclass
class Estimate:
    """A lab's estimated wall time here, stage by stage (None: finished already), and its extension rounds' bound."""

    lab: str
    stages: dict[str, tuple[int, float] | None]  # stage -> (trials, seconds) from a few timed steps, None when done
    extension_s: float  # the most the extension rounds add: every configuration at an end, every round
    searches: int  # searches still to run without extensions (each starts Ray and measures the predictors)


def estimate(lab: Lab, *, qualify_only: bool = False) -> Estimate:
    """Time a few steps of each stage still to run (``plan.estimate``'s own timing, in a child process), as its
    dry run does; nothing trains. The extension rounds add between nothing and ``max_rounds`` times one rate's trials
    of every configuration."""
    _, components, grid = base_space(lab.space)
    stages = {"full": list(FULL), "single": list(SINGLES)}
    if not qualify_only:
        stages["rest"] = [c for c in components if c not in (*FULL, *SINGLES)]
    found = Estimate(lab.name, {}, 0.0, 0)
    for stage, configs in stages.items():
        if (lab.dir / stage / "trials.csv").is_file():
            found.stages[stage] = None
            continue
        trials, seconds = _stage_seconds(lab, stage, configs)
        found.stages[stage] = (trials, seconds)
        found.extension_s += lab.max_rounds * seconds / len(grid)
        found.searches += 1
    return found


def _stage_seconds(lab: Lab, stage: str, components: list[str]) -> tuple[int, float]:
    """A stage's trials and its estimated wall seconds here, every trial its whole budget with as many at once as the
    CPUs allow: the middle of ``plan.estimate.wall_range``'s range (every trial as fast as the smallest subset
    timed, or as slow as the largest)."""
    from vitplast_tune.child import call_in_child
    from vitplast_tune.plan import estimate as est
    from vitplast_tune.plan.options import SearchOptions
    from vitplast_tune.plan.planner import prepare
    from vitplast_tune.workflows.preview import capacity

    space = stage_space(lab, stage, components)
    options = SearchOptions(
        space=str(space),
        name=stage,
        storage=str(lab.dir),
        tracking_uri=lab.tracking_uri,
        settings=lab.settings,
        resume=(lab.dir / stage / SEARCH_FILE).is_file(),
        cpus_per_trial=lab.cpus_per_trial,
        verbose=0,
    )
    plan = prepare(options)
    configs = est.timed_configs(plan)
    timed = call_in_child(
        "vitplast_tune.vit.training:time_steps", configs, "cpu", est.STEPS, est.BUDGET_S, plan.decoded
    )
    timings = [est.Timing(**{k: run[k] for k in est.Timing.__dataclass_fields__}) for run in timed["runs"]]
    where, nodes = capacity(None, timed["gpus"])
    fewest, most = est.wall_range(plan, timings, est.concurrency(plan, nodes, where))
    return plan.spec.total_trials, (fewest + most) / 2


def describe_estimates(found: list[Estimate]) -> str:
    """Each lab's estimated minutes, stage by stage, and in all."""
    lines = [
        "Estimated wall time here (a few training steps timed per stage; Ray's start and the measurements before "
        "each search's trials not counted):"
    ]
    total = 0.0
    for e in found:
        parts = [f"{s} done" if v is None else f"{s} {v[0]} trials {v[1] / 60:.1f} min" for s, v in e.stages.items()]
        base = sum(v[1] for v in e.stages.values() if v is not None)
        total += base
        lines.append(
            f"  {e.lab:<36} {'; '.join(parts)}; {base / 60:.1f} min in {e.searches} searches, extensions up to "
            f"+{e.extension_s / 60:.1f} min"
        )
    lines.append(f"  -> {total / 60:.1f} min in all before extensions")
    return "\n".join(lines)


def describe_report(lab: Lab, results) -> str:
    """The lab's analysis as text, with the minutes its searches took."""
    from vitplast_tune.analysis import lab as criteria

    minutes, stages = lab_minutes(lab)
    head = (
        f"Criteria lab {lab.name}: {MODELS[lab.model]} on {TASKS[lab.task]}, {stages} searches in {minutes:.1f} min "
        f"(as recorded when each finished), files in {lab.dir / 'analysis'}"
    )
    return head + "\n\n" + criteria.describe_lab(results)
