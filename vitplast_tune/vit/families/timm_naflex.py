"""Adapt timm's ``NaFlexVit``, trained here on fixed-size images as a standard ViT."""

from __future__ import annotations

from dataclasses import replace

from timm.models.naflexvit import NaFlexVit
from torch import Tensor, nn

from vitplast_tune.freezing import Layout
from vitplast_tune.vit.families.base import Embedded, Family
from vitplast_tune.vit.families.timm_eva import MHA_LINEARS, _rope_kwargs, _separate_qkv_bias

LAYOUT = replace(
    Layout("timm-naflex"),
    emb=("embeds", "rope", "norm_pre"),
    layer_scales={"mha": ("ls1", "gamma_1"), "fc2": ("ls2", "gamma_2")},
    lora={**Layout("timm-naflex").lora, "mha": MHA_LINEARS},
)


class TimmNaFlex(Family):
    """The family whose embedding output is ``_forward_embeds``; each block takes its rotary embedding and mask."""

    name = "timm-naflex"
    about = "timm NaFlexVit: flexible-resolution ViTs (naflexvit_*)"
    layout = LAYOUT

    model_classes = (NaFlexVit,)

    def embed(self, model: nn.Module, pixels: Tensor) -> Embedded:
        embeds = model._forward_embeds(pixels, patch_coord=None, patch_valid=None, attn_mask=None)
        kwargs = _rope_kwargs(embeds["rope_embeds"], len(model.blocks), model.rope_is_mixed)
        mask = embeds["attn_mask"]
        return Embedded(embeds["patches"], [{**k, "attn_mask": mask} for k in kwargs])

    def prepare_lora(self, model: nn.Module) -> None:
        _separate_qkv_bias(model)


FAMILY = TimmNaFlex()
