"""Check a search's model, weights, data and settings against each other, and decode a small dataset once.

This takes torch, so a driver without torch runs it in a short-lived child process, and holds none of it after.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import UserError
from vitplast_tune.subprocess_call import call_in_child

if TYPE_CHECKING:
    from vitplast_tune.data.decoded import InMemory


@dataclass(frozen=True)
class Budget:
    """A parameter budget (None: none), the subsets a search may train, and the settings at the space's corners."""

    max_trainable_params: int | None
    subsets: tuple[str, ...]
    trials: tuple[FinetuneConfig, ...] = ()


def check_inputs(
    settings: FinetuneConfig, reference: str | None, budget: Budget | None = None, augmentations: list[str] = ()
) -> tuple[InMemory | None, str]:
    """Check the model, weights, datasets, recipes and budget; return a small dataset decoded once and the recipe.

    It runs in this process when it holds torch already, else in a child process.
    """
    if "torch" in sys.modules:
        return _inspect_inputs(settings, reference, budget, list(augmentations))
    return call_in_child("vitplast_tune.plan.inputs:_inspect_inputs", settings, reference, budget, list(augmentations))


def _inspect_inputs(
    settings: FinetuneConfig, reference: str | None, budget: Budget | None, augmentations: list[str]
) -> tuple[InMemory | None, str]:
    """Run ``check_inputs`` in this process; the decoded dataset is shared with every trial."""
    from vitplast_tune.data import datasets, transforms
    from vitplast_tune.vit import model_checks, models, recipe

    # Check the model, its weights and what the recipe needs of timm or the model's family.
    config = models.pretrained_data_config(settings.model)
    models.check_weights(settings.model, settings.weights, settings.pretrained)
    recipe.check(settings)
    # Check the data: every auto_augment policy a trial may draw must follow a training crop.
    classes = datasets.num_classes(settings.dataset, settings.data_dir, settings.download)
    augment = datasets.resolve_augmentation(settings.dataset, settings.augment)
    recipes = {augment, *(datasets.resolve_augmentation(settings.dataset, a) for a in augmentations)}
    trials = budget.trials if budget is not None else ()
    for policy in sorted({c.auto_augment for c in (settings, *trials)} - {None}):
        for name in sorted(recipes):
            transforms.with_auto_augment(name, policy)
    if reference is not None:
        datasets.check_dataset_name(reference)
    # Refuse a data folder, download or image cache that no dataset a trial may read would use.
    drawn = tuple(dict.fromkeys(c.dataset for c in (settings, *trials)))
    datasets.check_applies((*drawn, *([reference] if reference else [])), settings.data_dir, settings.download)
    datasets.check_applies(drawn, None, False, settings.image_cache)
    image_cache = settings.image_cache
    if 0 < image_cache < max(config["input_size"][1:]):
        raise UserError(
            f"image_cache {image_cache} is below the model's input size {config['input_size'][-1]} px, so every image "
            f"would be enlarged again; use at least {round(config['input_size'][-1] / config.get('crop_pct', 1.0))} "
            "(the model's resize size), or 0 to decode the JPEGs each time"
        )
    # Check the model against the data, the corners' settings and the parameter budget.
    models.check_weights_fit(settings.model, settings.weights, classes)
    model_checks.check_fits_model(settings, classes, trials)
    if budget is not None and budget.max_trainable_params is not None:
        model_checks.check_budget(
            settings, classes, max_trainable_params=budget.max_trainable_params, subsets=budget.subsets
        )
    decoded = datasets.decode_dataset(
        settings.dataset, config, data_dir=settings.data_dir, download=settings.download, image_cache=image_cache
    )
    return decoded, augment
