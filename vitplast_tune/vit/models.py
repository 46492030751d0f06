"""Build models by name: timm models (hub weights, a local file or the shipped testbed) and ``hf:`` transformers models.

The testbed registers with timm here, its pretrained config pointing at the file in ``vitplast_tune/weights/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import timm
import torch
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn
from torch import nn

from vitplast_tune.config import TESTBED_MODEL, TESTBED_SEED1_MODEL, TESTBED_SEED1_WEIGHTS, TESTBED_WEIGHTS
from vitplast_tune.errors import UserError, did_you_mean
from vitplast_tune.type_checks import checked
from vitplast_tune.vit import (
    hub,
    tiny,  # noqa: F401  (registers the tiny models of every family with timm)
)
from vitplast_tune.vit.families import hf
from vitplast_tune.vit.families.base import Family
from vitplast_tune.vit.families.registry import _unsupported, family_of

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
# timm's register_model reads this name: the testbed pretrained from seed 0 (the default) and from seed 1.
default_cfgs = generate_default_cfgs(
    {
        TESTBED_MODEL: {"file": str(TESTBED_WEIGHTS), **_TESTBED_CFG},
        TESTBED_SEED1_MODEL: {"file": str(TESTBED_SEED1_WEIGHTS), **_TESTBED_CFG},
    }
)


@register_model
def vit_testbed_patch8_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Build the offline testbed: a 4-block, 96-wide ViT on 32 px images with 8 px patches."""
    return build_model_with_cfg(
        VisionTransformer,
        "vit_testbed_patch8_32",
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        **dict(TESTBED_ARGS, **kwargs),
    )


@checked(num_classes=0)
def create_model(
    name: str,
    num_classes: int,
    *,
    pretrained: bool = True,
    weights: str | Path | None = None,
    drop_path_rate: float = 0.0,
    **kwargs: Any,
) -> nn.Module:
    """Build a model by name with a new classification head.

    Args:
        name: A timm name, or ``hf:<hub id or folder>`` for a transformers model.
        num_classes: The head's classes (0: no head).
        pretrained: Whether to load the pretrained weights the name points at.
        weights: A local safetensors file or torch state dict to load instead (timm models).
        drop_path_rate: The stochastic depth rate.
        **kwargs: More arguments of ``timm.create_model``.

    Returns:
        The model.

    Raises:
        UserError: The name is unknown, the weights are missing or unreadable, or the family is unsupported.
    """
    check_weights(name, weights, pretrained)
    if hf._is_hf(name):
        model = hf._create(name, num_classes, pretrained=pretrained, drop_path_rate=drop_path_rate)
        family_of(model).check(model)
        return model
    create_kwargs: dict[str, Any] = dict(num_classes=num_classes, **kwargs)
    if drop_path_rate:
        create_kwargs["drop_path_rate"] = drop_path_rate
    if weights is not None:
        create_kwargs["pretrained_cfg_overlay"] = dict(file=str(Path(weights).expanduser()))
        pretrained = True
    try:
        model = timm.create_model(name, pretrained=pretrained, **create_kwargs)
    except (OSError, RuntimeError) as exc:  # hub unreachable, missing file, shape mismatch
        raise UserError(
            f'could not load pretrained weights for "{name}": {hf._one_line(exc)}; '
            "with no network, pass --weights PATH to a local file, or use the offline default "
            f'"{TESTBED_MODEL}"'
        ) from exc
    family_of(model).check(model)
    return model


def check_weights(name: str, weights: str | Path | None, pretrained: bool) -> None:
    """Check, without building it, that a model is known and the weights it needs can be read.

    Args:
        name: The model's name.
        weights: A local weights file (timm models only).
        pretrained: Whether the model loads pretrained weights.

    Raises:
        UserError: The model is unknown, a weights file is missing or unreadable, or weights it would download are not
            cached and their hub does not answer.
    """
    check_model_name(name)
    if weights is not None and hf._is_hf(name):
        raise UserError(f'--weights is for timm models; "{name}" loads its weights from its hub id or folder')
    if weights is not None:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise UserError(f"weights file {path} does not exist")
        _check_weights_file(path)
    elif pretrained:
        _check_shipped_file(name)
        if hf._is_hf(name):
            hf._check_weights(name)
        else:
            hub._check_timm_weights(name)  # fail fast offline, before download retries


def check_weights_fit(name: str, weights: str | Path | None, num_classes: int) -> None:
    """Check that a local weights file fits the model, as loading it for a trial would; UserError says how it differs.

    Names and shapes are compared on the meta device; where they differ, timm's own loading, which may adapt, decides.
    """
    if weights is None or hf._is_hf(name):
        return
    path = Path(weights).expanduser()
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, num_classes=num_classes)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = _tensor_shapes(path)
    cfg = getattr(model, "pretrained_cfg", {})
    heads = cfg.get("classifier") or () if num_classes != cfg.get("num_classes") else ()  # as timm drops a head
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    is_head = lambda key: key.rsplit(".", 1)[0] in heads
    differences = _differences({k: v for k, v in expected.items() if not is_head(k)}, found, is_head)
    if not differences:
        return
    try:
        with torch.device("meta"):
            create_model(name, num_classes, weights=path)
    except UserError:
        raise UserError(
            f'weights file {path} does not fit "{name}": {differences}; give the weights of that model (or the model '
            "those weights are of)"
        ) from None


def _tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Read the names and shapes of a weights file's tensors: a safetensors header, else a memory-mapped load."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            names = f.keys()  # a safe_open handle is not iterable
            return {k: tuple(f.get_slice(k).get_shape()) for k in names}
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # a file of torch's legacy format cannot be memory-mapped
        state = torch.load(path, map_location="cpu", weights_only=True)
    return {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def _differences(expected: dict[str, tuple], found: dict[str, tuple], is_head) -> str:
    """Say how a file's tensors differ from the model's, its head left out; empty when they agree."""
    missing = [k for k in expected if k not in found]
    extra = [k for k in found if k not in expected and not is_head(k)]
    shapes = [k for k in expected if k in found and found[k] != expected[k]]
    listed = lambda keys: ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
    size = lambda shape: "x".join(map(str, shape)) or "scalar"
    said = [
        f"{len(missing)} of the model's tensors missing ({listed(missing)})" if missing else "",
        f"{len(extra)} tensors the model lacks ({listed(extra)})" if extra else "",
        f"{len(shapes)} of other shapes ({shapes[0]}: {size(found[shapes[0]])} in the file, "
        f"{size(expected[shapes[0]])} in the model{', ...' if len(shapes) > 1 else ''})"
        if shapes
        else "",
    ]
    return "; ".join(s for s in said if s)


def _check_weights_file(path: Path) -> None:
    """Raise UserError unless ``path`` reads as a safetensors file or a torch state dict."""
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
            f"weights file {path} is unreadable or corrupt ({hf._one_line(exc)}); "
            "pass a safetensors file or a torch state dict saved with torch.save"
        ) from None
    if not isinstance(state, dict):
        raise UserError(
            f"weights file {path} holds a {type(state).__name__}, not a state dict; save model.state_dict()"
        )


def check_model_name(name: str) -> None:
    """Raise UserError unless ``name`` is a model of a supported family, suggesting near timm names."""
    _family_of_name(name)


def _family_of_name(name: str) -> Family:
    """Return the family of the model ``name`` names, without building it."""
    if hf._is_hf(name):
        return hf.MODEL_TYPES[hf._load_config(name).model_type]
    arch = name.split(".", 1)[0]
    if not timm.is_model(arch):
        options = timm.list_models("vit_*") + timm.list_models("deit*") + timm.list_models("eva*")
        raise UserError(f'unknown timm model "{name}"{did_you_mean(arch, options)}')
    with torch.device("meta"):  # build the class alone, with no weights
        model = timm.create_model(arch, pretrained=False)
    try:
        return family_of(model)
    except UserError:
        raise UserError(f'"{name}" is {_unsupported(type(model).__name__)}') from None


def data_config(model: nn.Module) -> dict[str, Any]:
    """Read a model's timm data config.

    Args:
        model: The model.

    Returns:
        Its data config: input_size, mean, std, interpolation and crop_pct.
    """
    return timm.data.resolve_data_config({}, model=model)


def pretrained_data_config(name: str) -> dict[str, Any]:
    """Read a model's data config by name, without building it where its pretrained config has one.

    Args:
        name: The model's name (timm, or ``hf:``).

    Returns:
        The data config.

    Raises:
        UserError: The model is unknown.
    """
    check_model_name(name)
    if hf._is_hf(name):
        return hf._data_config(name)
    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None:
        return timm.data.resolve_data_config({}, model=timm.create_model(name, pretrained=False))
    return timm.data.resolve_data_config(pretrained_cfg=cfg.to_dict())


def _check_shipped_file(name: str) -> None:
    """Refuse a shipped weights file that is missing, or pretrained weights for a model that has none."""
    if hf._is_hf(name):
        return
    cfg = timm.models.get_pretrained_cfg(name)
    file = getattr(cfg, "file", None) if cfg is not None else None
    if file and not Path(file).is_file():
        raise UserError(f'weights of "{name}" not found at {file}; make them with: vitplast pretrain')
    if cfg is not None and not (file or cfg.url or cfg.hf_hub_id):
        raise UserError(f'"{name}" has no pretrained weights; train it from scratch with pretrained=false')
