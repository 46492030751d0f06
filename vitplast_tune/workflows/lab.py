"""Run the criteria lab's stages as searches in one Ray instance, then check, analyze and estimate a lab."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from vitplast_tune import log
from vitplast_tune.analysis import bracket
from vitplast_tune.lab import qualify as check
from vitplast_tune.lab.estimate import Estimate
from vitplast_tune.lab.records import lab_trials, stage_dirs, write_kept
from vitplast_tune.lab.stages import base_space, stage_components, stage_space
from vitplast_tune.lab.tasks import FULL, MODELS, SINGLES, TASKS, Lab, lab_minutes, read_lab_record, record_stage
from vitplast_tune.storage import SEARCH_FILE

if TYPE_CHECKING:
    from vitplast_tune.analysis.subsets import LabResult
    from vitplast_tune.plan.options import SearchOptions

_log = log.get_logger(__name__)


def _stage_options(
    lab: Lab, stage: str, components: list[str], lrs: list[float] | None = None, verbose: int = 1
) -> SearchOptions:
    """Build one stage's search options, resuming a stage that has started."""
    from vitplast_tune.plan.options import SearchOptions

    return SearchOptions(
        space=str(stage_space(lab, stage, components, lrs)),
        name=stage,
        storage=str(lab.dir),
        tracking_uri=lab.tracking_uri,
        settings=lab.settings,
        resume=(lab.dir / stage / SEARCH_FILE).is_file(),
        cpus_per_trial=lab.cpus_per_trial,
        verbose=verbose,
    )


def run_stage(lab: Lab, stage: str, components: list[str], lrs: list[float] | None = None) -> pd.DataFrame:
    """Return one stage's trials, running or resuming its search unless it has finished."""
    from vitplast_tune.records.table import read_trials
    from vitplast_tune.run import driver

    directory = lab.dir / stage
    if (directory / "trials.csv").is_file():
        return read_trials(directory)
    options = _stage_options(lab, stage, components, lrs, lab.verbose)
    _say(lab, f"[{lab.name}] stage {stage}: {len(components)} configuration(s){'' if lrs is None else f' at lr {lrs}'}")
    started = time.perf_counter()
    found = driver.run(options)
    record_stage(lab, stage, components, lrs, seconds=time.perf_counter() - started, trials=len(found.trials))
    return found.trials


def bracketed_stage(lab: Lab, stage: str, components: list[str]) -> pd.DataFrame:
    """Run a stage, then extend its grid while a configuration's best rate lies at an end of it.

    Each round trains such a configuration at the next rate beyond that end, for at most ``lab.max_rounds`` rounds.
    """
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
def ray_session() -> Iterator[None]:
    """Start one local Ray instance for the stages run inside, unless Ray runs already, and shut it down after.

    Yields:
        Nothing.
    """
    import ray

    from vitplast_tune.run import cluster, interrupts

    if ray.is_initialized():
        yield
        return
    with interrupts.before_start(resuming=True):  # a signal here raises SearchInterrupted, as within a search
        with interrupts.starting_ray():
            cluster.init(None)
        try:
            yield
        finally:
            ray.shutdown()


def qualify(lab: Lab) -> check.Qualification:
    """Check a task by running its ``full`` and ``single`` stages and judging it on validation data.

    Args:
        lab: The lab.

    Returns:
        The qualification, which is also written into the lab's record.
    """
    found = check.judge_full(lab, bracketed_stage(lab, "full", list(FULL)))
    if not found.reason:  # a saturated task does not train its single components
        found = check.judge_singles(found, bracketed_stage(lab, "single", list(SINGLES)))
    return check.record_qualification(lab, found)


def _run_rest(lab: Lab) -> pd.DataFrame:
    """Run the ``rest`` stage, which trains every other subset of the space, with its extensions."""
    rest = stage_components(lab)["rest"]
    return bracketed_stage(lab, "rest", rest) if rest else pd.DataFrame()


def run_lab(lab: Lab, *, even_if_unqualified: bool = False) -> tuple[check.Qualification, Any]:
    """Check the task, then train the other subsets and analyze the lab if the task qualifies.

    Args:
        lab: The lab.
        even_if_unqualified: Whether to go on after a failed check.

    Returns:
        The qualification and the lab's analysis, which is None when the lab stopped after the check.
    """
    found = qualify(lab)
    _say(lab, check.describe_qualifications([found]))
    if not (found.qualifies or even_if_unqualified):
        return found, None
    _run_rest(lab)
    return found, analyze_lab(lab)


def in_network(lab: Lab, subsets: Iterable[str]) -> pd.Series:
    """Return each subset's mean in-network plasticity, measured once per model and then cached."""
    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.predictors.report import in_network_scores
    from vitplast_tune.storage import read_record

    first = stage_dirs(lab.dir)[0]  # every stage trains the same model on the same task
    settings = FinetuneConfig.from_dict(read_record(first, purpose="recorded")["settings"])
    return in_network_scores(settings, list(subsets))["in_network_mean"]


def keep(lab: Lab, out: Path) -> None:
    """Write the lab's kept records into ``out``."""
    trials = lab_trials(lab.dir)
    restored = read_lab_record(lab.dir).get("restored")  # another machine ran the check; its tables come first
    earlier = lab.storage / restored["copy"] if restored else None
    write_kept(lab.dir, out, in_network(lab, trials["components"].unique()), earlier=earlier)


def analyze_lab(lab: Lab, *, n_boot: int | None = None) -> Any:
    """Analyze every stage's trials together and write the results to ``<lab>/analysis``.

    Args:
        lab: The lab.
        n_boot: The number of bootstrap resamples, or None for the analysis's default.

    Returns:
        The analysis's results.
    """
    from vitplast_tune.analysis import subsets as criteria

    trials = lab_trials(lab.dir)
    extra = in_network(lab, trials["components"].unique()).to_frame()
    _, _, grid = base_space(lab.space)
    results = criteria.criteria_lab({None: trials}, extra, grid_lrs=grid, n_boot=n_boot or criteria.N_BOOT)
    out = lab.dir / "analysis"
    criteria.write_lab(results, out)
    trials.to_csv(out / "lab_trials.csv", index=False)
    return results


def describe_report(lab: Lab, results: list[LabResult]) -> str:
    """Describe the lab's analysis and the minutes its searches took as text."""
    from vitplast_tune.analysis.subsets_report import describe_lab

    minutes, stages = lab_minutes(lab)
    head = (
        f"Criteria lab {lab.name}: {MODELS[lab.model]} on {TASKS[lab.task]}, {stages} searches in {minutes:.1f} min "
        f"(as recorded when each finished), files in {lab.dir / 'analysis'}"
    )
    return head + "\n\n" + describe_lab(results)


def estimate(lab: Lab, *, qualify_only: bool = False) -> Estimate:
    """Estimate the lab's time by timing a few steps of each stage still to run, without training.

    The extension rounds may add up to ``max_rounds`` times one rate's trials of every configuration.
    """
    _, _, grid = base_space(lab.space)
    stages = stage_components(lab)
    if qualify_only:
        stages.pop("rest")
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
    """Return a stage's trials and the middle of its estimated wall time here."""
    from vitplast_tune.plan import estimate as est
    from vitplast_tune.plan.planner import prepare
    from vitplast_tune.workflows.preview import _capacity, _time_steps

    plan = prepare(_stage_options(lab, stage, components, verbose=0))
    timings, _, gpus = _time_steps(plan, "cpu")
    where, nodes = _capacity(None, gpus)
    fewest, most = est.wall_range(plan, timings, est.concurrency(plan, nodes, where))
    return plan.spec.total_trials, (fewest + most) / 2


def _say(lab: Lab, text: str) -> None:
    if lab.verbose:
        _log.info(text)
