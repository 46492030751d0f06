"""Whether a search's settings fit its model, checked before Ray starts (``plan.inputs``): block indices and LoRA
ranks within the model's blocks and layers, and some subset within the parameter budget."""

from __future__ import annotations

import torch

from vitplast_tune import freezing
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import UserError
from vitplast_tune.vit import methods, models
from vitplast_tune.vit.families.registry import layout_of


def check_fits_model(settings: FinetuneConfig, classes: int, trials: tuple[FinetuneConfig, ...] = ()) -> None:
    """Check that the settings, and each trial's, fit the model; built on the meta device: no memory, no weights read.

    Args:
        settings: the search's trial settings (its model among them).
        classes: the dataset's classes (the model's head).
        trials: the settings of other trials (the space's corners), checked the same way.

    Raises:
        UserError: a depth or block index beyond the model's blocks (its family's layout says where they are), or a
            LoRA rank above the width of a layer it adapts.
    """
    with torch.device("meta"):
        model = models.create_model(settings.model, classes, pretrained=False)
    depth = freezing.num_blocks(model, layout_of(model))
    for cfg in (settings, *trials):
        if cfg.blocks is not None and max(cfg.blocks) >= depth:
            raise UserError(
                f"blocks {cfg.blocks}: block {max(cfg.blocks)} is beyond {settings.model}, which has {depth} blocks "
                f"(0-{depth - 1})"
            )
        blocks = cfg.block_indices(depth)  # a depth beyond the model's blocks raises here
        targets = methods.lora_targets(model, cfg.components, blocks)
        if not targets:
            continue
        methods.require_peft(cfg.components)  # a LoRA trial without the lora extra: one line, before Ray starts
        width, layer = min(
            (min(model.get_submodule(t).in_features, model.get_submodule(t).out_features), t) for t in targets
        )
        if cfg.lora_rank > width:
            raise UserError(
                f"lora_rank {cfg.lora_rank} is above the width of the layers LoRA adapts in {settings.model} ({width} "
                f"at {layer}); use at most {width} (a rank near the width trains as many parameters as the layer)"
            )


def check_budget(
    settings: FinetuneConfig, classes: int, *, max_trainable_params: int, subsets: tuple[str, ...]
) -> None:
    """Check that some subset the search may train is within the parameter budget.

    Counted on an untrained model with the dataset's head and the settings' blocks.

    Args:
        settings: the search's trial settings (its model and blocks).
        classes: the dataset's classes (the model's head).
        max_trainable_params: the parameter budget.
        subsets: every component subset the search may train.

    Raises:
        UserError: every subset is over the budget: the search could train nothing.
    """
    model = models.create_model(settings.model, classes, pretrained=False)
    layout = layout_of(model)
    counts = {s: sum(freezing.freeze(model, s, settings.blocks, layout=layout).values()) for s in subsets}
    smallest = min(counts, key=counts.get)
    if counts[smallest] > max_trainable_params:
        head = sum(freezing.freeze(model, "head", layout=layout).values())
        raise UserError(
            f"no trial fits the parameter budget max_trainable_params {max_trainable_params:,}: the smallest "
            f"subset the search may train, {smallest}, trains {counts[smallest]:,} parameters (the head alone "
            f"{head:,}); raise the budget, or let components include smaller subsets"
        )
