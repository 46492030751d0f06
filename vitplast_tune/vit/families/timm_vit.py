"""Adapt timm's ``VisionTransformer`` and its subclasses: ViT, DeiT (distilled too), hybrids, register tokens."""

from __future__ import annotations

from dataclasses import replace

from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from vitplast_tune.freezing import Layout
from vitplast_tune.vit.families.base import Embedded, Family

LAYOUT = replace(
    Layout("timm-vit"),
    emb=(*Layout("timm-vit").emb, "dist_token"),
    head=(*Layout("timm-vit").head, "head_dist"),
)


class TimmViT(Family):
    """The family whose embedding output is ``norm_pre(patch_drop(_pos_embed(patch_embed(x))))``."""

    name = "timm-vit"
    about = "timm VisionTransformer and subclasses: ViT, DeiT (distilled too), hybrids (vit_*, deit*, vit_*_r50_*)"
    layout = LAYOUT

    model_classes = (VisionTransformer,)

    def embed(self, model: nn.Module, pixels: Tensor) -> Embedded:
        return Embedded(model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(pixels)))))


FAMILY = TimmViT()
