"""The checks of a search that need its model and data: the model and its weights file, the dataset, the plasticity
reference, the augmentation recipes, and that the settings fit the model and some subset the parameter budget
(``vit.model_checks``); and the small dataset decoded once for every trial.

That takes torch, timm and torchvision, memory a process keeps once it has imported them, and after this only
trials and measurements (Ray workers) need them. So when this process has not imported torch (the command line),
the checks run in a short-lived Python process (``child.call_in_child``): the driver holds none of it while trials
run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vitplast_tune.child import call_in_child
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import UserError

if TYPE_CHECKING:
    from vitplast_tune.data.decoded import InMemory


@dataclass(frozen=True)
class Budget:
    """A parameter budget (None: none) and the subsets a search may train, checked against each other before Ray."""

    max_trainable_params: int | None
    subsets: tuple[str, ...]
    # The settings of trials at the space's corners (every choice, both ends of every range), checked against the
    # model they will meet: block ranges and indices within its depth, LoRA ranks within its layers' width.
    trials: tuple[FinetuneConfig, ...] = ()


def check_inputs(
    settings: FinetuneConfig, reference: str | None, budget: Budget | None = None, augmentations: list[str] = ()
) -> tuple[InMemory | None, str]:
    """Check the model, its weights file, the dataset, the plasticity reference (None: none), that some subset fits
    the parameter budget and the augmentation recipes (the settings' and ``augmentations``, a space's searched ones);
    return a small dataset decoded once and the settings' recipe, the dataset's default when unset. In this process
    when it holds torch already, else in a child process (see the module's docstring)."""
    if "torch" in sys.modules:
        return inspect_inputs(settings, reference, budget, list(augmentations))
    return call_in_child("vitplast_tune.plan.inputs:inspect_inputs", settings, reference, budget, list(augmentations))


def inspect_inputs(
    settings: FinetuneConfig, reference: str | None, budget: Budget | None, augmentations: list[str]
) -> tuple[InMemory | None, str]:
    """``check_inputs`` in this process. The decoded dataset (None for datasets read lazily from disk) is shared with
    every trial through the object store, so it is decoded here and nowhere else on the driver."""
    from vitplast_tune.data import datasets, transforms
    from vitplast_tune.vit import model_checks, models, recipe

    # The model: its data config, its weights file, what the recipe's settings need of timm or its family.
    config = models.pretrained_data_config(settings.model)
    models.check_weights(settings.model, settings.weights, settings.pretrained)
    recipe.check(settings)
    # The data: its classes, the augmentation recipes a trial may draw (the dataset's default named) and that every
    # ``auto_augment`` policy a trial may draw follows a training crop, the plasticity reference.
    classes = datasets.num_classes(settings.dataset, settings.data_dir, settings.download)
    augment = datasets.resolve_augmentation(settings.dataset, settings.augment)
    recipes = {augment, *(datasets.resolve_augmentation(settings.dataset, a) for a in augmentations)}
    trials = budget.trials if budget is not None else ()
    for policy in sorted({c.auto_augment for c in (settings, *trials)} - {None}):
        for name in sorted(recipes):
            transforms.with_auto_augment(name, policy)
    if reference is not None:
        datasets.check_dataset_name(reference)
    # The datasets a data folder, a download or an image cache may go to: the settings', any a trial may draw, the
    # plasticity reference; one that none of them reads is refused.
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
    # The model meets the data: its weights' head, the settings at the space's corners, the parameter budget.
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
