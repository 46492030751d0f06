"""The criteria lab's driver: each stage of a task's lab run as a search (``run.driver``) in one shared Ray instance,
extended beyond the grid where a configuration's best rate lies at an end of the rates it was trained at, the
qualifying check (``lab.qualify``, on validation data), the rest of the lab, its analysis, and its estimated time.

A stage whose trial table exists is done, one with a record and no table is resumed, so the same command run again
goes on where it stopped. No torch at import; Ray and the search driver are imported where a stage runs.
"""

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


def stage_options(
    lab: Lab, stage: str, components: list[str], lrs: list[float] | None = None, verbose: int = 1
) -> SearchOptions:
    """The search options of one stage: its space file, in the lab's folder and MLflow store, resumed when started.

    Args:
        lab: the lab.
        stage: the stage's name.
        components: its configurations.
        lrs: its rates (None: the space's).
        verbose: the search's verbosity.

    Returns:
        The stage's ``SearchOptions``.
    """
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
    """One stage's trials: read when its search finished, else run (or resumed) and its wall time recorded.

    Args:
        lab: the lab.
        stage: the stage's name.
        components: its configurations.
        lrs: its rates (None: the space's).

    Returns:
        The stage's trial table.
    """
    from vitplast_tune.records.table import read_trials
    from vitplast_tune.run import driver

    directory = lab.dir / stage
    if (directory / "trials.csv").is_file():
        return read_trials(directory)
    options = stage_options(lab, stage, components, lrs, lab.verbose)
    _say(lab, f"[{lab.name}] stage {stage}: {len(components)} configuration(s){'' if lrs is None else f' at lr {lrs}'}")
    started = time.perf_counter()
    found = driver.run(options)
    record_stage(lab, stage, components, lrs, seconds=time.perf_counter() - started, trials=len(found.trials))
    return found.trials


def bracketed_stage(lab: Lab, stage: str, components: list[str]) -> pd.DataFrame:
    """A stage and its extension rounds (every configuration whose best rate is at an end of its rates trained at
    the next one, one search per rate, at most ``lab.max_rounds`` rounds).

    Args:
        lab: the lab.
        stage: the stage's name.
        components: its configurations.

    Returns:
        The trials of the stage and of its extensions together.
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
    """One local Ray instance for every stage search run inside, shut down after; nothing when Ray runs already.

    A signal while Ray starts or between stages ends in SearchInterrupted, as one within a stage's search does.

    Yields:
        Nothing: the stages run inside.
    """
    import ray

    from vitplast_tune.run import cluster, interrupts

    if ray.is_initialized():
        yield
        return
    # Ctrl-C or SIGTERM while Ray starts or between stages: one line and 130 or 143, as within a stage's search.
    with interrupts.before_start(resuming=True):
        with interrupts.starting_ray():
            cluster.init(None)
        try:
            yield
        finally:
            ray.shutdown()


def qualify(lab: Lab) -> check.Qualification:
    """Check a task: run (or read) its ``full`` and ``single`` stages and judge it on validation data.

    A saturated task's single components are not trained (``lab.qualify`` judges).

    Args:
        lab: the lab.

    Returns:
        Its qualification, also written into its record.
    """
    found = check.judge_full(lab, bracketed_stage(lab, "full", list(FULL)))
    if not found.reason:
        found = check.judge_singles(found, bracketed_stage(lab, "single", list(SINGLES)))
    return check.record_qualification(lab, found)


def run_rest(lab: Lab) -> pd.DataFrame:
    """The lab's ``rest`` stage (every other subset of the space) with its extensions.

    Args:
        lab: the lab.

    Returns:
        Its trials (none when the space has no other subset).
    """
    rest = stage_components(lab)["rest"]
    return bracketed_stage(lab, "rest", rest) if rest else pd.DataFrame()


def run_lab(lab: Lab, *, even_if_unqualified: bool = False) -> tuple[check.Qualification, Any]:
    """Run the whole lab on its task: the check, then the other subsets, then the lab's analysis.

    The other subsets (with their extensions) run when the task qualifies, or with ``even_if_unqualified``.

    Args:
        lab: the lab.
        even_if_unqualified: run the rest even on a task that fails the check.

    Returns:
        (qualification, the lab's analysis or None when not run further).
    """
    found = qualify(lab)
    _say(lab, check.describe_qualifications([found]))
    if not (found.qualifies or even_if_unqualified):
        return found, None
    run_rest(lab)
    return found, analyze_lab(lab)


def in_network(lab: Lab, subsets: Iterable[str]) -> pd.Series:
    """Each subset's mean in-network plasticity (measured once per model, then read from its cache).

    Args:
        lab: the lab (a finished stage's recorded settings).
        subsets: the subsets.

    Returns:
        ``in_network_mean`` by subset.
    """
    from vitplast_tune.config import FinetuneConfig
    from vitplast_tune.predictors.report import in_network_scores
    from vitplast_tune.storage import read_record

    first = stage_dirs(lab.dir)[0]  # every stage trains the same model on the same task
    settings = FinetuneConfig.from_dict(read_record(first, purpose="recorded")["settings"])
    return in_network_scores(settings, list(subsets))["in_network_mean"]


def keep(lab: Lab, out: Path) -> None:
    """Write the lab's kept records (``lab.records``: trials, curves, per-image test correctness) into ``out``.

    Args:
        lab: the lab.
        out: the folder.
    """
    trials = lab_trials(lab.dir)
    restored = read_lab_record(lab.dir).get("restored")  # its check kept on another machine: those tables first
    earlier = lab.storage / restored["copy"] if restored else None
    write_kept(lab.dir, out, in_network(lab, trials["components"].unique()), earlier=earlier)


def analyze_lab(lab: Lab, *, n_boot: int | None = None) -> Any:
    """The lab's analysis over every stage's trials (``analysis.subsets.criteria_lab``), written to ``<lab>/analysis``.

    Args:
        lab: the lab.
        n_boot: resamples (default: the analysis's).

    Returns:
        Its results.
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
    """The lab's analysis as text, with the minutes its searches took.

    Args:
        lab: the lab.
        results: its analysis.

    Returns:
        The text.
    """
    from vitplast_tune.analysis.subsets_report import describe_lab

    minutes, stages = lab_minutes(lab)
    head = (
        f"Criteria lab {lab.name}: {MODELS[lab.model]} on {TASKS[lab.task]}, {stages} searches in {minutes:.1f} min "
        f"(as recorded when each finished), files in {lab.dir / 'analysis'}"
    )
    return head + "\n\n" + describe_lab(results)


def estimate(lab: Lab, *, qualify_only: bool = False) -> Estimate:
    """Time a few steps of each stage still to run (``plan.estimate``'s own timing, in a child process); nothing
    trains. The extension rounds add between nothing and ``max_rounds`` times one rate's trials of every
    configuration.

    Args:
        lab: the lab.
        qualify_only: the check's stages only.

    Returns:
        The lab's estimate.
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
    """A stage's trials and its estimated wall seconds here: the middle of ``plan.estimate.wall_range``'s range."""
    from vitplast_tune.child import call_in_child
    from vitplast_tune.plan import estimate as est
    from vitplast_tune.plan.planner import prepare
    from vitplast_tune.workflows.preview import capacity

    plan = prepare(stage_options(lab, stage, components, verbose=0))
    configs = est.timed_configs(plan)
    timed = call_in_child(
        "vitplast_tune.vit.training:time_steps", configs, "cpu", est.STEPS, est.BUDGET_S, plan.decoded
    )
    timings = [est.Timing(**{k: run[k] for k in est.Timing.__dataclass_fields__}) for run in timed["runs"]]
    where, nodes = capacity(None, timed["gpus"])
    fewest, most = est.wall_range(plan, timings, est.concurrency(plan, nodes, where))
    return plan.spec.total_trials, (fewest + most) / 2


def _say(lab: Lab, text: str) -> None:
    if lab.verbose:
        _log.info(text)
