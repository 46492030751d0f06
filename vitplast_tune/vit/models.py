"""timm Vision Transformers: building them (by timm name, from a local weights file, or the shipped
testbed), and the one place that knows timm's ViT internals (the embedding path, the block layout).

Every model goes through ``timm.create_model``. The offline testbed ViT is registered with timm
here (``vit_testbed_patch8_32.fractal``), and its pretrained config points at the safetensors
file committed in ``vitplast_tune/weights/``, so it loads through the same path a user's
``vit_base_patch16_224.augreg_in21k`` does, with no network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import timm
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn
from torch import Tensor, nn

from vitplast_tune.components import BLOCK_MODULES
from vitplast_tune.config import TESTBED_MODEL, TESTBED_SEED1_MODEL, TESTBED_SEED1_WEIGHTS, TESTBED_WEIGHTS
from vitplast_tune.errors import UserError, did_you_mean

TESTBED_ARGS: dict[str, Any] = dict(img_size=32, patch_size=8, embed_dim=96, depth=4, num_heads=3)

_TESTBED_CFG: dict[str, Any] = {
    "num_classes": 64,
    "input_size": (3, 32, 32),
    "crop_pct": 1.0,
    "interpolation": "bilinear",
    "mean": (0.5, 0.5, 0.5),
    "std": (0.5, 0.5, 0.5),
    "first_conv": "patch_embed.proj",
    "classifier": "head",
    "license": "mit",
}
# timm's register_model reads the pretrained configs from this module-level name: the testbed pretrained from seed 0
# (the default) and from seed 1, two models of one architecture.
default_cfgs = generate_default_cfgs(
    {
        TESTBED_MODEL: {"file": str(TESTBED_WEIGHTS), **_TESTBED_CFG},
        TESTBED_SEED1_MODEL: {"file": str(TESTBED_SEED1_WEIGHTS), **_TESTBED_CFG},
    }
)


@register_model
def vit_testbed_patch8_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """The offline testbed: a 4-block, 96-wide ViT on 32 px images with 8 px patches."""
    return build_model_with_cfg(
        VisionTransformer,
        "vit_testbed_patch8_32",
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        **dict(TESTBED_ARGS, **kwargs),
    )


def create_model(
    name: str,
    num_classes: int,
    *,
    pretrained: bool = True,
    weights: str | Path | None = None,
    **kwargs: Any,
) -> VisionTransformer:
    """Build a timm ViT by name with a new ``num_classes`` head.

    ``pretrained`` loads the weights named by the timm tag (from the hub, or the shipped file for
    the testbed); ``weights`` loads a local safetensors file or torch state dict instead
    (``weights_only=True``). Raises UserError for an unknown name or a non-ViT model.
    """
    check_weights(name, weights, pretrained)
    create_kwargs: dict[str, Any] = dict(num_classes=num_classes, **kwargs)
    if weights is not None:
        create_kwargs["pretrained_cfg_overlay"] = dict(file=str(Path(weights).expanduser()))
        pretrained = True
    try:
        model = timm.create_model(name, pretrained=pretrained, **create_kwargs)
    except (OSError, RuntimeError) as exc:  # hub unreachable, missing file, shape mismatch
        raise UserError(
            f'could not load pretrained weights for "{name}": {_one_line(exc)}; '
            "with no network, pass --weights PATH to a local file, or use the offline default "
            f'"{TESTBED_MODEL}"'
        ) from exc
    if not isinstance(model, VisionTransformer):
        raise UserError(f'"{name}" is a {type(model).__name__}, not a timm VisionTransformer')
    return model


def check_weights(name: str, weights: str | Path | None, pretrained: bool) -> None:
    """Raise UserError when the model is unknown, or a local weights file it needs is missing or unreadable."""
    check_model_name(name)
    if weights is not None:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise UserError(f"weights file {path} does not exist")
        check_weights_file(path)
    elif pretrained:
        _check_shipped_file(name)


def check_weights_file(path: Path) -> None:
    """Raise UserError unless ``path`` reads as a safetensors file or a torch state dict (``weights_only``)."""
    import torch
    from safetensors import safe_open

    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:  # reads and checks the header only
                f.keys()
            return
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # safetensors, pickle and zip errors have no common base
        raise UserError(
            f"weights file {path} is unreadable or corrupt ({_one_line(exc)}); "
            "pass a safetensors file or a torch state dict saved with torch.save"
        ) from None
    if not isinstance(state, dict):
        raise UserError(
            f"weights file {path} holds a {type(state).__name__}, not a state dict; save model.state_dict()"
        )


def check_model_name(name: str) -> None:
    """Raise UserError unless ``name`` (with an optional ".tag") is a timm model, suggesting near names."""
    arch = name.split(".", 1)[0]
    if not timm.is_model(arch):
        options = timm.list_models("vit_*") + timm.list_models("deit*")
        raise UserError(f'unknown timm model "{name}"{did_you_mean(arch, options)}')


def data_config(model: VisionTransformer) -> dict[str, Any]:
    """The model's own timm data config: input_size, mean, std, interpolation, crop_pct."""
    return timm.data.resolve_data_config({}, model=model)


def pretrained_data_config(name: str) -> dict[str, Any]:
    """The data config of a timm model name without building it (from its pretrained config)."""
    check_model_name(name)
    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None:
        return timm.data.resolve_data_config({}, model=timm.create_model(name, pretrained=False))
    return timm.data.resolve_data_config(pretrained_cfg=cfg.to_dict())


def embed(model: nn.Module, pixels: Tensor) -> Tensor:
    """The input of block 0: patch_embed -> _pos_embed (prefix tokens + pos embed) -> patch_drop -> norm_pre."""
    return model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(pixels))))


def block_module(block: nn.Module, component: str) -> nn.Module | None:
    """The submodule of a ViT block that a block component names (``BLOCK_MODULES``), or None."""
    module: Any = block
    for name in BLOCK_MODULES[component].split("."):
        module = getattr(module, name, None)
        if not isinstance(module, nn.Module):
            return None
    return module


def vit_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's blocks, after checking it has the timm VisionTransformer layout (UserError otherwise)."""
    needed = ("patch_embed", "_pos_embed", "patch_drop", "norm_pre", "blocks")
    if not all(hasattr(model, name) for name in needed):
        raise UserError(f"{type(model).__name__} is not a timm VisionTransformer (needs {', '.join(needed)})")
    blocks = list(model.blocks)
    if not blocks:
        raise UserError("the model has no blocks")
    for i, block in enumerate(blocks):
        for component, path in BLOCK_MODULES.items():
            if block_module(block, component) is None:
                raise UserError(
                    f"block {i} has no {path}: only the standard ViT block "
                    "(norm1, attn, norm2, mlp.fc1, mlp.fc2) is supported"
                )
        fc2 = block.mlp.fc2
        if not isinstance(fc2, nn.Linear) or fc2.in_features < fc2.out_features:
            raise UserError(f"block {i}: mlp.fc2 must be an nn.Linear from the hidden width to the model width")
    return blocks


def _check_shipped_file(name: str) -> None:
    """A pretrained config that names a local file (the testbed) must find it; say how to make it."""
    cfg = timm.models.get_pretrained_cfg(name)
    file = getattr(cfg, "file", None) if cfg is not None else None
    if file and not Path(file).is_file():
        raise UserError(f'weights of "{name}" not found at {file}; make them with: vitplast-pretrain')


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")
