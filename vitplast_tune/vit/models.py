"""Building the models a run finetunes: timm models by name (from the hub, a local weights file, or the shipped
testbed) and transformers models by ``hf:<hub id or folder>``, each of a supported family (``vit/families/``).

Every timm model goes through ``timm.create_model``. The offline testbed ViT is registered with timm
here (``vit_testbed_patch8_32.fractal``), and its pretrained config points at the safetensors
file committed in ``vitplast_tune/weights/``, so it loads through the same path a user's
``vit_base_patch16_224.orig_in21k`` does, with no network; ``vit/tiny.py`` registers a tiny random model of every
other timm family.
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
from vitplast_tune.typed import checked
from vitplast_tune.vit import (
    hub,
    tiny,  # noqa: F401  (registers the tiny models of every family with timm)
)
from vitplast_tune.vit.families import hf
from vitplast_tune.vit.families.base import Family
from vitplast_tune.vit.families.registry import family_of, unsupported

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
        pretrained: Whether to load the weights the timm tag names (from the hub, or the shipped file for the
            testbed) or the transformers model's.
        weights: A local safetensors file or torch state dict to load instead (``weights_only=True``; timm models).
        drop_path_rate: The stochastic depth rate.
        **kwargs: More arguments of ``timm.create_model``.

    Returns:
        The model.

    Raises:
        UserError: If the name is unknown, the weights are missing or unreadable, or the model is of no supported
            family (``vit.families.registry``).
    """
    check_weights(name, weights, pretrained)
    if hf.is_hf(name):
        model = hf.create(name, num_classes, pretrained=pretrained, drop_path_rate=drop_path_rate)
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
            f'could not load pretrained weights for "{name}": {_one_line(exc)}; '
            "with no network, pass --weights PATH to a local file, or use the offline default "
            f'"{TESTBED_MODEL}"'
        ) from exc
    family_of(model).check(model)
    return model


def check_weights(name: str, weights: str | Path | None, pretrained: bool) -> None:
    """Check, without building it, that a model is known and the weights it needs can be read.

    Args:
        name: The model's name.
        weights: A local weights file to load (timm models only).
        pretrained: Whether the model loads its pretrained weights (the testbed's shipped file must exist).

    Raises:
        UserError: If the model is unknown, a weights file it needs is missing or unreadable, or weights it would
            download are not cached and their hub cannot be reached (``vit.hub``).
    """
    check_model_name(name)
    if weights is not None and hf.is_hf(name):
        raise UserError(f'--weights is for timm models; "{name}" loads its weights from its hub id or folder')
    if weights is not None:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise UserError(f"weights file {path} does not exist")
        check_weights_file(path)
    elif pretrained:
        _check_shipped_file(name)
        if hf.is_hf(name):
            hf.check_weights(name)
        else:
            hub.check_timm_weights(name)  # cached, or the hub answers in seconds: no download's retries offline


def check_weights_fit(name: str, weights: str | Path | None, num_classes: int) -> None:
    """Check that a local weights file fits the model it is given to, as loading it for a trial would.

    The file's tensor names and shapes (its header alone, for safetensors) are compared with the model's state dict,
    the model built on the meta device (no memory); where they differ, timm's own loading (which may adapt a
    checkpoint, e.g. resample position embeddings) decides, still on the meta device.

    Args:
        name: The model's name (a timm name; ``hf:`` models take no weights file).
        weights: The weights file (None: nothing to check).
        num_classes: The classes of the head the trials give the model (a pretrained head of another size is
            dropped, as timm does).

    Raises:
        UserError: If the weights do not fit the model; the message says how they differ.
    """
    if weights is None or hf.is_hf(name):
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
    """The names and shapes of the tensors a weights file holds: a safetensors file's header, else the state dict
    loaded memory-mapped."""
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
    """How a file's tensors (``found``) differ from a model's (``expected``, its head left out), in words; empty when
    they agree."""
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
    """Raise UserError unless ``name`` is a model of a supported family: a timm name (with an optional ".tag"),
    suggesting near names, or ``hf:`` and a transformers config that can be read."""
    family_of_name(name)


def family_of_name(name: str) -> Family:
    """The family of the model ``name`` names, without building it (a timm model's class on the meta device, a
    transformers model's type from its config); UserError for an unknown name or an unsupported family."""
    if hf.is_hf(name):
        return hf.MODEL_TYPES[hf.load_config(name).model_type]
    arch = name.split(".", 1)[0]
    if not timm.is_model(arch):
        options = timm.list_models("vit_*") + timm.list_models("deit*") + timm.list_models("eva*")
        raise UserError(f'unknown timm model "{name}"{did_you_mean(arch, options)}')
    with torch.device("meta"):  # the class alone, without weights or initialisation costs
        model = timm.create_model(arch, pretrained=False)
    try:
        return family_of(model)
    except UserError:
        raise UserError(f'"{name}" is {unsupported(type(model).__name__)}') from None


def data_config(model: nn.Module) -> dict[str, Any]:
    """Read a model's own timm data config.

    Args:
        model: The model.

    Returns:
        Its data config: input_size, mean, std, interpolation, crop_pct.
    """
    return timm.data.resolve_data_config({}, model=model)


def pretrained_data_config(name: str) -> dict[str, Any]:
    """Read the data config of a model by name, without building it where its pretrained config has one.

    Args:
        name: The model's name (timm, or ``hf:``: the transformers model's config).

    Returns:
        The data config: input_size, mean, std, interpolation, crop_pct.

    Raises:
        UserError: If the model is unknown.
    """
    check_model_name(name)
    if hf.is_hf(name):
        return hf.data_config(name)
    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None:
        return timm.data.resolve_data_config({}, model=timm.create_model(name, pretrained=False))
    return timm.data.resolve_data_config(pretrained_cfg=cfg.to_dict())


def _check_shipped_file(name: str) -> None:
    """A pretrained config that names a local file (the testbed) must find it, saying how to make it; one that names
    no weights anywhere (the tiny models) cannot be pretrained."""
    if hf.is_hf(name):
        return
    cfg = timm.models.get_pretrained_cfg(name)
    file = getattr(cfg, "file", None) if cfg is not None else None
    if file and not Path(file).is_file():
        raise UserError(f'weights of "{name}" not found at {file}; make them with: vitplast pretrain')
    if cfg is not None and not (file or cfg.url or cfg.hf_hub_id):
        raise UserError(f'"{name}" has no pretrained weights; train it from scratch with pretrained=false')


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")
