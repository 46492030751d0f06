"""Tiny random models of every supported family, for tests: timm ones by name (the ``*_testbed_*`` models and small
variants of others), transformers ones as folders holding a tiny config (``hf:<folder>``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import timm
import torch
from timm.layers import SwiGLU

SMALL: dict[str, Any] = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)

# (family, how to build a tiny one): a registered name, a timm name with small dims, or a transformers config
TIMM: dict[str, tuple[str, str, dict[str, Any]]] = {
    "vit": ("timm-vit", "vit_testbed_patch8_32", {}),
    "deit-distilled": ("timm-vit", "deit_testbed_distilled_patch8_32", {}),
    "vit-swiglu-regs": (
        "timm-vit",
        "vit_small_patch16_224",
        dict(SMALL, mlp_layer=SwiGLU, reg_tokens=2, init_values=0.1),
    ),
    "vit-hybrid": ("timm-vit", "vit_tiny_r_s16_p8_224", dict(img_size=32, depth=2)),
    "eva02": ("timm-eva", "eva02_testbed_patch8_32", {}),
    "eva02-fused": ("timm-eva", "eva02_tiny_patch14_224", dict(SMALL, ref_feat_shape=(4, 4))),
    "dinov3": ("timm-eva", "vit_small_patch16_dinov3", dict(SMALL, swiglu_mlp=True)),
    "rope-mixed": ("timm-eva", "vit_small_patch16_rope_mixed_224", SMALL),
    "beit": ("timm-beit", "beit_testbed_patch8_32", {}),
    "beit-shared": (
        "timm-beit",
        "beit_base_patch16_224",
        dict(SMALL, use_rel_pos_bias=False, use_shared_rel_pos_bias=True),
    ),
    "relpos": ("timm-relpos", "vit_relpos_testbed_patch8_32", {}),
    "relpos-rpn": ("timm-relpos", "vit_relpos_small_patch16_rpn_224", SMALL),
    "naflex": ("timm-naflex", "naflexvit_testbed_patch8_32", {}),
}
HF: dict[str, str] = {
    "hf-vit": "hf-vit",
    "hf-deit": "hf-deit",
    "hf-dinov2": "hf-dinov2",
    "hf-dinov2-swiglu": "hf-dinov2",
    "hf-dinov2-registers": "hf-dinov2-registers",
}
# One model per registered family, by the name a run gives (``hf:`` ones made by ``hf_folder``).
PER_FAMILY = {
    "timm-vit": "deit-distilled",
    "timm-eva": "eva02",
    "timm-beit": "beit",
    "timm-relpos": "relpos",
    "timm-naflex": "naflex",
    "hf-vit": "hf-vit",
    "hf-deit": "hf-deit",
    "hf-dinov2": "hf-dinov2-swiglu",
    "hf-dinov2-registers": "hf-dinov2-registers",
}
FAMILY_OF = {**{k: v[0] for k, v in TIMM.items()}, **HF}


def hf_config(kind: str):
    """A tiny transformers config of ``kind`` (32 px images, 8 px patches, 2 layers of width 32)."""
    import transformers

    args = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_labels=3)
    if kind == "hf-vit":
        return transformers.ViTConfig(intermediate_size=64, **args)
    if kind == "hf-deit":
        return transformers.DeiTConfig(intermediate_size=64, **args)
    if kind == "hf-dinov2":
        return transformers.Dinov2Config(layerscale_value=0.5, **args)
    if kind == "hf-dinov2-swiglu":
        return transformers.Dinov2Config(use_swiglu_ffn=True, layerscale_value=0.5, **args)
    return transformers.Dinov2WithRegistersConfig(num_register_tokens=2, layerscale_value=0.5, **args)


def hf_folder(root: Path, kind: str) -> str:
    """``hf:<folder>`` of a folder under ``root`` holding a tiny config of ``kind`` (written once)."""
    folder = Path(root) / kind
    if not (folder / "config.json").is_file():
        hf_config(kind).save_pretrained(folder)
    return f"hf:{folder}"


def model_name(kind: str, root: Path) -> str:
    """The name a run gives the tiny model ``kind`` (a registered timm name, or ``hf:<folder>``)."""
    return hf_folder(root, kind) if kind in HF else TIMM[kind][1]


def build(kind: str, root: Path, num_classes: int = 5, seed: int = 0) -> torch.nn.Module:
    """A tiny random model of ``kind``, in eval mode, with non-trivial norms, biases, tokens and layer scales (timm
    initialises some of them to 0 or 1)."""
    from vitplast_tune.vit import models

    torch.manual_seed(seed)
    if kind in HF:
        model = models.create_model(hf_folder(root, kind), num_classes, pretrained=False)
    else:
        _, name, kwargs = TIMM[kind]
        model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim <= 1 or "token" in name or "embed" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()
