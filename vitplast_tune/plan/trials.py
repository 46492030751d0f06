"""What every trial a space can draw needs of the search's workers, checked before Ray: a batch that divides among a
trial's data-parallel workers, and an even share for each worker where mixup or cutmix pairs its images.

A trial checks these itself (``vit.distributed.check_batch``), but only once Ray runs it; and a space's corners vary
one parameter at a time, so a batch size and a mixup value that fail only together would slip past them. Here every
combination of the values the space can draw for ``batch_size``, ``mixup`` and ``cutmix`` is checked (a few values
each: a choice's, a range's ends, every integer of a ``randint`` batch size).
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


def drawable(spec: SearchSpec, settings: FinetuneConfig, key: str) -> list[Any]:
    """List the values of setting ``key`` a trial of ``spec`` may train with.

    Args:
        spec: The search's space.
        settings: The search's trial settings.
        key: A setting's name.

    Returns:
        The space's values (every integer of a ``randint``, both ends of another range, every choice), else the
        settings' one value.
    """
    param = spec.parameters.get(key)
    if param is None:
        return [getattr(settings, key)]
    if isinstance(param, RandInt) and param.high - param.low < MAX_INTEGERS:
        return list(range(param.low, param.high + 1))
    return list(param.corners())


def check_batches(spec: SearchSpec, settings: FinetuneConfig, workers: int) -> None:
    """Check that each trial ``spec`` may draw can share its batch among its ``workers`` data-parallel workers.

    Args:
        spec: The search's space.
        settings: The search's trial settings (what the space does not search).
        workers: The data-parallel workers of each trial.

    Raises:
        UserError: If some batch size the space may draw does not divide among the workers, or leaves a worker an odd
            share while mixup or cutmix is on.
    """
    if workers < 1:
        return
    values = [drawable(spec, settings, key) for key in KEYS]
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
    """`` (drawn by <space>)`` when the space searches the batch size, else nothing."""
    param = spec.parameters.get("batch_size")
    return "" if param is None or isinstance(param, Constant) else f" (drawn by {spec.path.name})"
