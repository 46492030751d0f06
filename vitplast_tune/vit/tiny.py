"""Register a tiny random model of every timm family with timm, to check a family offline (docs/models.md)."""

from __future__ import annotations

from typing import Any

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.beit import Beit
from timm.models.deit import VisionTransformerDistilled
from timm.models.eva import Eva
from timm.models.naflexvit import NaFlexVit, NaFlexVitCfg
from timm.models.vision_transformer_relpos import VisionTransformerRelPos

SMALL: dict[str, Any] = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
_CFG = dict(
    num_classes=10, input_size=(3, 32, 32), crop_pct=1.0, interpolation="bilinear", mean=(0.5,) * 3, std=(0.5,) * 3
)
NAMES = (
    "deit_testbed_distilled_patch8_32",
    "eva02_testbed_patch8_32",
    "beit_testbed_patch8_32",
    "vit_relpos_testbed_patch8_32",
    "naflexvit_testbed_patch8_32",
)
# timm's register_model reads the pretrained configs from this module-level name.
default_cfgs = generate_default_cfgs({name: dict(_CFG) for name in NAMES})


def _build(cls: type, name: str, pretrained: bool, **kwargs: Any):
    return build_model_with_cfg(cls, name, pretrained, **kwargs)


@register_model
def deit_testbed_distilled_patch8_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformerDistilled:
    """Build a tiny distilled DeiT, with class and distillation tokens and two heads."""
    return _build(VisionTransformerDistilled, "deit_testbed_distilled_patch8_32", pretrained, **{**SMALL, **kwargs})


@register_model
def eva02_testbed_patch8_32(pretrained: bool = False, **kwargs: Any) -> Eva:
    """Build a tiny EVA-02, with rotary embeddings, a SwiGLU MLP and separate q/k/v projections."""
    args = dict(SMALL, mlp_ratio=4 * 2 / 3, qkv_fused=False, swiglu_mlp=True, scale_mlp=True, use_rot_pos_emb=True)
    return _build(Eva, "eva02_testbed_patch8_32", pretrained, **{**args, "ref_feat_shape": (4, 4), **kwargs})


@register_model
def beit_testbed_patch8_32(pretrained: bool = False, **kwargs: Any) -> Beit:
    """Build a tiny BEiT, with relative position tables, layer scales and separate q and v biases."""
    args = dict(SMALL, use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=0.1)
    return _build(Beit, "beit_testbed_patch8_32", pretrained, **{**args, **kwargs})


@register_model
def vit_relpos_testbed_patch8_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformerRelPos:
    """Build a tiny ViT with relative position MLPs and layer scales, average pooled."""
    args = dict(SMALL, qkv_bias=False, init_values=0.1, fc_norm=True)
    return _build(VisionTransformerRelPos, "vit_relpos_testbed_patch8_32", pretrained, **{**args, **kwargs})


@register_model
def naflexvit_testbed_patch8_32(pretrained: bool = False, **kwargs: Any) -> NaFlexVit:
    """Build a tiny NaFlexViT with register tokens and layer scales, on fixed 32 px images."""
    cfg = NaFlexVitCfg(
        patch_size=8, embed_dim=32, depth=2, num_heads=2, init_values=0.1, reg_tokens=2, global_pool="avg", fc_norm=True
    )
    kwargs = {"img_size": 32, **kwargs}
    return _build(NaFlexVit, "naflexvit_testbed_patch8_32", pretrained, cfg=cfg, **kwargs)
