"""timm's ``Beit``: BEiT and BEiT v2 (relative position tables in each block's attention, or one shared by every
block, layer scales ``gamma_1`` / ``gamma_2``, separate q / v biases)."""

from __future__ import annotations

from dataclasses import replace

import torch
from timm.models.beit import Beit
from torch import Tensor, nn

from vitplast_tune.freezing import Layout
from vitplast_tune.vit.families.base import Embedded, Family
from vitplast_tune.vit.families.timm_eva import separate_qkv_bias

# A table shared by every block is model level, beside the position embedding: emb.
LAYOUT = replace(
    Layout("timm-beit"),
    emb=(*Layout("timm-beit").emb, "rel_pos_bias"),
    layer_scales={"mha": ("gamma_1",), "fc2": ("gamma_2",)},
)


class TimmBeit(Family):
    """``patch_embed -> class token -> + pos_embed -> pos_drop`` is the embedding output; every block takes the shared
    relative position bias, when the model has one."""

    name = "timm-beit"
    about = "timm Beit: BEiT, BEiT v2 (beit_*, beitv2_*)"
    layout = LAYOUT

    model_classes = (Beit,)

    def embed(self, model: nn.Module, pixels: Tensor) -> Embedded:
        x = model.patch_embed(pixels)
        x = torch.cat((model.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        if model.pos_embed is not None:
            x = x + model.pos_embed
        shared = model.rel_pos_bias() if model.rel_pos_bias is not None else None
        return Embedded.shared(model.pos_drop(x), len(model.blocks), shared_rel_pos_bias=shared)

    def prepare_lora(self, model: nn.Module) -> None:
        separate_qkv_bias(model)


FAMILY = TimmBeit()
