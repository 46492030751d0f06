"""Check that every trial a space can draw can share its batch among its data-parallel workers, before Ray starts.

A space's corners vary one parameter at a time, so a batch size and a mixup value that fail only together would slip
past them; here every combination of the values the space can draw for the keys is checked.
"""

from __future__ import annotations

import itertools
from typing import Any

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import UserError, option
from vitplast_tune.space.distributions import Constant, RandInt
from vitplast_tune.space.files import SearchSpec

KEYS = ("batch_size", "mixup", "cutmix")  # the settings a trial's share of the batch depends on
MAX_INTEGERS = 4096  # a randint batch size wider than this is checked at its ends only


def _drawable(spec: SearchSpec, settings: FinetuneConfig, key: str) -> list[Any]:
    """List the values of setting ``key`` a trial may train with: a randint's every integer, else its corners."""
    param = spec.parameters.get(key)
    if param is None:
        return [getattr(settings, key)]
    if isinstance(param, RandInt) and param.high - param.low < MAX_INTEGERS:
        return list(range(param.low, param.high + 1))
    return list(param.corners())


def _check_batches(spec: SearchSpec, settings: FinetuneConfig, workers: int) -> None:
    """Refuse a batch size the space may draw that does not divide among the workers, or splits oddly under mixup."""
    if workers < 1:
        return
    values = [_drawable(spec, settings, key) for key in KEYS]
    for batch, mixup, cutmix in itertools.product(*values):
        _check_one(spec, batch, mixup > 0 or cutmix > 0, workers)


def _check_one(spec: SearchSpec, batch: int, mixing: bool, workers: int) -> None:
    where = _where(spec)
    if batch % workers:
        raise UserError(
            f"batch_size {batch}{where} does not divide among the {workers} data-parallel workers of a trial "
            f"({option('workers_per_trial', workers)}): give a multiple of {workers}"
        )
    share = batch // workers
    if mixing and share % 2:
        raise UserError(
            f"mixup and cutmix pair the images within each worker's share of the batch: batch_size {batch}{where} "
            f"over {workers} workers gives {share} each, an odd number; give a multiple of {2 * workers}"
        )


def _where(spec: SearchSpec) -> str:
    """Say where a drawn batch size comes from: `` (drawn by <space>)``, or nothing for a fixed one."""
    param = spec.parameters.get("batch_size")
    return "" if param is None or isinstance(param, Constant) else f" (drawn by {spec.path.name})"
