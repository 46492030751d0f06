"""Adapt timm's ``VisionTransformerRelPos``: ViTs with relative position biases instead of a position embedding."""

from __future__ import annotations

from dataclasses import replace

import torch
from timm.models.vision_transformer_relpos import VisionTransformerRelPos
from torch import Tensor, nn

from vitplast_tune.freezing import Layout
from vitplast_tune.vit.families.base import Embedded, Family

LAYOUT = replace(Layout("timm-relpos"), emb=(*Layout("timm-relpos").emb, "shared_rel_pos"))


class TimmRelPos(Family):
    """The family whose embedding output is the patches and class token; each block takes the shared bias."""

    name = "timm-relpos"
    about = "timm VisionTransformerRelPos: ViTs with relative position biases (vit_relpos_*, vit_srelpos_*)"
    layout = LAYOUT

    model_classes = (VisionTransformerRelPos,)

    def embed(self, model: nn.Module, pixels: Tensor) -> Embedded:
        x = model.patch_embed(pixels)
        if model.cls_token is not None:
            x = torch.cat((model.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        shared = model.shared_rel_pos.get_bias() if model.shared_rel_pos is not None else None
        return Embedded.shared(x, len(model.blocks), shared_rel_pos=shared)


FAMILY = TimmRelPos()
