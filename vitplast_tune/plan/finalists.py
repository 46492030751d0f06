"""The finalists stage of a search's plan (``space.finalists``): the flags over the space file's key, whether the stage
fits the search (else refused, or a space file's stage turned off with a note), and the seeds it trains on; and
whether the baselines' reference trials (``space.baselines``) fit it."""

from __future__ import annotations

from dataclasses import replace

from vitplast_tune.errors import SpaceError
from vitplast_tune.space.baselines import references
from vitplast_tune.space.files import SearchSpec
from vitplast_tune.space.finalists import BASELINES, OFF, Finalists, count


def with_finalists(spec: SearchSpec, top: int | None, seeds: int | None) -> SearchSpec:
    """Apply the command line's ``--finalists-top`` and ``--finalists-seeds`` to a copy of the space.

    Args:
        spec: The space.
        top: The configurations in place of the file's (None: the file's).
        seeds: The seeds in place of the file's (None: the file's).

    Returns:
        The copy (``spec`` when neither is given).

    Raises:
        SpaceError: A count below 0.
    """
    if top is None and seeds is None:
        return spec
    given = spec.finalists
    top = given.top if top is None else count(top, "--finalists-top")
    seeds = given.seeds if seeds is None else count(seeds, "--finalists-seeds")
    return replace(spec, finalists=Finalists(top, seeds))


def fit_finalists(spec: SearchSpec, flagged: bool) -> tuple[SearchSpec, list[str]]:
    """Check that the space's finalists stage fits its search, or turn off a space file's stage that does not.

    The stage needs Optuna (grid and random search run Tune's variant generator, which suggests no trial after the
    search's), and one objective, validation accuracy (it ranks and judges by it). A space file's stage (not the
    flags') is turned off, with a note, under an ``--objective`` that is not accuracy, and when the search has no
    more trials than the stage has configurations (``--num-samples``; it would train every trial's configuration
    again: a smoke test, not a search).

    The baselines' reference trials are turned off too, with a note, where the search has fewer than twice as many
    trials of its own (``fit_baselines``).

    Args:
        spec: The space, with the options' overrides.
        flagged: Whether ``--finalists-top`` or ``--finalists-seeds`` set the stage.

    Returns:
        The space (its stage off where turned off) and the notes saying so.

    Raises:
        SpaceError: The stage asked of a grid or random search, or by a flag of a search that is not on accuracy.
    """
    spec, notes = fit_baselines(spec)
    spec, more = _fit_stage(spec, flagged)
    return spec, notes + more


def fit_baselines(spec: SearchSpec) -> tuple[SearchSpec, list[str]]:
    """Turn off the baselines' reference trials, with a note, where the search has fewer than twice as many trials of
    its own (``--num-samples``): they would be a third of its trials or more, a smoke test rather than a search.

    Args:
        spec: The space, with the options' overrides.

    Returns:
        The space (without baselines where turned off) and the note saying so.
    """
    made = len(references(spec.parameters, spec.baselines))
    if not made or spec.num_samples >= 2 * made:
        return spec, []
    note = (
        f"no baselines' reference trials ({spec.num_samples} trial(s) are fewer than twice their {made}: full "
        f"finetuning and the linear probe at {spec.baselines} rate(s) each); a space's baselines: {{rates: R}} sets them"
    )
    return replace(spec, baselines=0), [note]


def _fit_stage(spec: SearchSpec, flagged: bool) -> tuple[SearchSpec, list[str]]:
    """``fit_finalists`` for the finalists stage alone."""
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
    """The seeds the finalists train on: the next ones above the search's training ``seed`` and any seed its space
    samples, so that none is a seed a trial of the search trained on."""
    sampled = spec.parameters.get("seed")
    taken = [seed, *(v for v in (sampled.corners() if sampled is not None else []) if isinstance(v, int))]
    return list(range(max(taken) + 1, max(taken) + 1 + spec.finalists.seeds))
