"""Check a search's settings against its model before Ray starts: block indices, LoRA ranks, the parameter budget."""

from __future__ import annotations

import torch

from vitplast_tune import freezing
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.errors import UserError
from vitplast_tune.vit import methods, models
from vitplast_tune.vit.families.registry import layout_of


def check_fits_model(settings: FinetuneConfig, classes: int, trials: tuple[FinetuneConfig, ...] = ()) -> None:
    """Check that the settings and each trial's fit the model, built on the meta device.

    Raises UserError when a block is beyond the model's blocks, or a LoRA rank is above the width of a layer it adapts.
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
        methods._require_peft(cfg.components)  # refuse LoRA without peft before Ray starts
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
    """Check that some subset the search may train fits the parameter budget; UserError when every one is over."""
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
