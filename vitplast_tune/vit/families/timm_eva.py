"""Adapt timm's ``Eva``: EVA, EVA-02, DINOv3 and the rotary ``vit_*_rope_*`` ViTs."""

from __future__ import annotations

from dataclasses import replace

from timm.models.eva import Eva
from torch import Tensor, nn

from vitplast_tune.freezing import Layout
from vitplast_tune.vit.families.base import Embedded, Family

MHA_LINEARS = ("attn.qkv", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.proj")
LAYOUT = replace(
    Layout("timm-eva"),
    emb=(*Layout("timm-eva").emb, "rope"),
    layer_scales={"mha": ("gamma_1", "ls1"), "fc2": ("gamma_2", "ls2")},
    lora={**Layout("timm-eva").lora, "mha": MHA_LINEARS},
)


def _rope_kwargs(rope, num_blocks: int, mixed: bool) -> list[dict]:
    """Return each block's rotary embedding: none, a shared one, or (mixed) its own."""
    if rope is None:
        return [{} for _ in range(num_blocks)]
    if mixed:
        return [{"rope": r} for r in list(rope)[:num_blocks]]
    return [{"rope": rope} for _ in range(num_blocks)]


def _separate_qkv_bias(model: nn.Module) -> None:
    """Make attention with separate q and v biases call ``qkv`` as a module, so that LoRA on it acts."""
    for module in model.modules():
        if getattr(module, "q_bias", None) is not None and hasattr(module, "qkv_bias_separate"):
            module.qkv_bias_separate = True


class TimmEva(Family):
    """The family whose embedding output follows ``_pos_embed`` and ``norm_pre``; blocks take their rotary embedding."""

    name = "timm-eva"
    about = "timm Eva: EVA, EVA-02, DINOv3, rotary ViTs (eva02_*, vit_*_dinov3*, vit_*_rope_*)"
    layout = LAYOUT

    model_classes = (Eva,)

    def embed(self, model: nn.Module, pixels: Tensor) -> Embedded:
        x, rope = model._pos_embed(model.patch_embed(pixels))
        kwargs = _rope_kwargs(rope, len(model.blocks), getattr(model, "rope_mixed", False))
        return Embedded(model.norm_pre(x), kwargs)

    def prepare_lora(self, model: nn.Module) -> None:
        _separate_qkv_bias(model)


FAMILY = TimmEva()
