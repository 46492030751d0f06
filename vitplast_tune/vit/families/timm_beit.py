"""Adapt timm's ``Beit``: BEiT and BEiT v2, with relative position tables and layer scales."""

from __future__ import annotations

from dataclasses import replace

import torch
from timm.models.beit import Beit
from torch import Tensor, nn

from vitplast_tune.freezing import Layout
from vitplast_tune.vit.families.base import Embedded, Family
from vitplast_tune.vit.families.timm_eva import _separate_qkv_bias

# A table shared by every block is model level, beside the position embedding: emb.
LAYOUT = replace(
    Layout("timm-beit"),
    emb=(*Layout("timm-beit").emb, "rel_pos_bias"),
    layer_scales={"mha": ("gamma_1",), "fc2": ("gamma_2",)},
)


class TimmBeit(Family):
    """The family whose embedding output is the patches, class token and positions; blocks take the shared bias."""

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
        _separate_qkv_bias(model)


FAMILY = TimmBeit()
