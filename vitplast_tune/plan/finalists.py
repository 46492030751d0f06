"""Fit a space's finalists stage and baselines to the search, or turn them off with a note."""

from __future__ import annotations

from dataclasses import replace

from vitplast_tune.errors import SpaceError
from vitplast_tune.space.baselines import references
from vitplast_tune.space.files import SearchSpec
from vitplast_tune.space.finalists import BASELINES, OFF, Finalists, count


def _with_finalists(spec: SearchSpec, top: int | None, seeds: int | None) -> SearchSpec:
    """Apply ``--finalists-top`` and ``--finalists-seeds`` to a copy of the space."""
    if top is None and seeds is None:
        return spec
    given = spec.finalists
    top = given.top if top is None else count(top, "--finalists-top")
    seeds = given.seeds if seeds is None else count(seeds, "--finalists-seeds")
    return replace(spec, finalists=Finalists(top, seeds))


def _fit_finalists(spec: SearchSpec, flagged: bool) -> tuple[SearchSpec, list[str]]:
    """Fit the finalists stage (Optuna, accuracy, enough trials) and baselines to the search, with notes."""
    spec, notes = _fit_baselines(spec)
    spec, more = _fit_stage(spec, flagged)
    return spec, notes + more


def _fit_baselines(spec: SearchSpec) -> tuple[SearchSpec, list[str]]:
    """Turn off the baselines' reference trials, with a note, when the search has fewer than twice as many."""
    made = len(references(spec.parameters, spec.baselines))
    if not made or spec.num_samples >= 2 * made:
        return spec, []
    note = (
        f"no baselines' reference trials ({spec.num_samples} trial(s) are fewer than twice their {made}: full "
        f"finetuning and the linear probe at {spec.baselines} rate(s) each); a space's baselines: {{rates: R}} sets them"
    )
    return replace(spec, baselines=0), [note]


def _fit_stage(spec: SearchSpec, flagged: bool) -> tuple[SearchSpec, list[str]]:
    """Fit the finalists stage alone."""
    stage = spec.finalists
    if not stage.on:
        return (spec if stage == OFF else replace(spec, finalists=OFF)), []
    asked = "--finalists-top/--finalists-seeds" if flagged else f"{spec.path.name}'s finalists"
    if spec.algorithm != "optuna":
        raise SpaceError(
            f"{asked}: the finalists stage needs algorithm: optuna ({spec.algorithm} search runs the configurations "
            "it lists, and no stage after them); set finalists: {top: 0, seeds: 0} or --finalists-top 0"
        )
    why = None
    if spec.multi_objective or spec.metric != "val_acc":
        why = f"it ranks and judges by validation accuracy, and this search optimises {spec.metric}"
        if flagged:
            raise SpaceError(f"{asked}: {why} (with --objective accuracy it applies)")
    elif not flagged and spec.num_samples <= stage.top + len(BASELINES):
        why = f"{spec.num_samples} trial(s) are no more than its {stage.top + len(BASELINES)} configurations"
    if why is None:
        return spec, []
    note = f"no finalists stage ({why}); --finalists-top and --finalists-seeds ask for one"
    return replace(spec, finalists=OFF), [note]


def finalist_seeds(spec: SearchSpec, seed: int) -> list[int]:
    """Return the seeds the finalists train on: the next ones above every seed a trial of the search trained on."""
    sampled = spec.parameters.get("seed")
    taken = [seed, *(v for v in (sampled.corners() if sampled is not None else []) if isinstance(v, int))]
    return list(range(max(taken) + 1, max(taken) + 1 + spec.finalists.seeds))
