"""Adapt Hugging Face transformers' ViT, DeiT and DINOv2 classifiers, named ``hf:<hub id>`` or ``hf:<folder>``.

transformers is imported only where such a model is built or checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor, nn

from vitplast_tune.errors import UserError
from vitplast_tune.freezing import Layout
from vitplast_tune.log import quieted
from vitplast_tune.vit import hub
from vitplast_tune.vit.families.base import Embedded, Family

PREFIX = "hf:"
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
_RESAMPLE = {2: "bilinear", 3: "bicubic", 0: "nearest"}  # PIL's codes, as image processors store them


class HFClassifier(nn.Module):
    """A transformers image classifier as a module from normalised pixels to logits, with timm's data config."""

    def __init__(self, model: nn.Module, data_config: dict[str, Any], source: str):
        super().__init__()
        self.model = model
        self.pretrained_cfg = dict(data_config)
        self.source = source

    def forward(self, pixels: Tensor) -> Tensor:
        """Return the logits of a batch of normalised images."""
        return self.model(pixel_values=pixels).logits


def _hf_layout(family: str, backbone: str, blocks: str, **changes: Any) -> Layout:
    """Build the layout of a classifier whose backbone is ``model.<backbone>``, its blocks at ``blocks``."""
    root = f"model.{backbone}"
    base = dict(
        family=family,
        blocks=f"{root}.{blocks}",
        emb=(f"{root}.embeddings",),
        head=(f"{root}.layernorm", f"{root}.pooler", "model.classifier", "model.cls_classifier"),
        modules={
            "ln1": ("layernorm_before",),
            "mha": ("attention",),
            "ln2": ("layernorm_after",),
            "fc1": ("mlp.fc1",),
            "fc2": ("mlp.fc2",),
        },
        extras={},
        layer_scales={},
        lora={
            "mha": ("attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj"),
            "fc1": ("mlp.fc1",),
            "fc2": ("mlp.fc2",),
        },
    )
    return Layout(**{**base, **changes})


_DINO = dict(
    modules={
        "ln1": ("norm1",),
        "mha": ("attention",),
        "ln2": ("norm2",),
        "fc1": ("mlp.fc1", "mlp.gate_proj", "mlp.up_proj"),
        "fc2": ("mlp.fc2", "mlp.down_proj"),
    },
    layer_scales={"mha": ("layer_scale1",), "fc2": ("layer_scale2",)},
    lora={
        "mha": ("attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj"),
        "fc1": ("mlp.fc1", "mlp.gate_proj", "mlp.up_proj"),
        "fc2": ("mlp.fc2", "mlp.down_proj"),
    },
)


class HFFamily(Family):
    """Transformers classifiers of some model types, whose backbone's ``embeddings`` is the embedding output."""

    cache_features = False  # the head (pooling differs per model type) is not reproduced here: no feature cache

    def __init__(
        self,
        name: str,
        about: str,
        model_types: tuple[str, ...],
        backbone: str,
        layout: Layout,
        *,
        drop_path: bool = False,
        normalisation: tuple[tuple[float, ...], tuple[float, ...]] = IMAGENET,
    ):
        self.name, self.about, self.model_types, self.backbone, self.layout = name, about, model_types, backbone, layout
        self.drop_path, self.normalisation = drop_path, normalisation

    model_classes = (HFClassifier,)

    def rank(self, model: nn.Module) -> int | None:
        if isinstance(model, HFClassifier) and model.model.config.model_type in self.model_types:
            return 0
        return None

    def embed(self, model: nn.Module, pixels: Tensor) -> Embedded:
        return Embedded(getattr(model.model, self.backbone).embeddings(pixels))

    def head(self, model: nn.Module, tokens: Tensor) -> Tensor:
        raise NotImplementedError(f"{self.name}: no head on cached features")

    def head_tokens(self, model: nn.Module) -> int | None:
        return None

    def set_grad_checkpointing(self, model: nn.Module, enable: bool) -> None:
        inner = model.model
        # transformers 5 renames gradient checkpointing to activation checkpointing (the old names warn)
        on = getattr(inner, "activation_checkpointing_enable", None) or inner.gradient_checkpointing_enable
        off = getattr(inner, "activation_checkpointing_disable", None) or inner.gradient_checkpointing_disable
        (on if enable else off)()


FAMILIES = (
    HFFamily(
        "hf-vit",
        "transformers ViTForImageClassification (hf:google/vit-base-patch16-224-in21k, ...)",
        ("vit",),
        "vit",
        _hf_layout("hf-vit", "vit", "layers"),
        normalisation=HALF,
    ),
    HFFamily(
        "hf-deit",
        "transformers DeiTForImageClassification (hf:facebook/deit-base-distilled-patch16-224, ...)",
        ("deit",),
        "deit",
        _hf_layout(
            "hf-deit", "deit", "layers", head=_hf_layout("", "deit", "").head + ("model.distillation_classifier",)
        ),
    ),
    HFFamily(
        "hf-dinov2",
        "transformers Dinov2ForImageClassification (hf:facebook/dinov2-base, ...)",
        ("dinov2",),
        "dinov2",
        _hf_layout("hf-dinov2", "dinov2", "encoder.layer", **_DINO),
        drop_path=True,
    ),
    HFFamily(
        "hf-dinov2-registers",
        "transformers Dinov2WithRegistersForImageClassification (hf:facebook/dinov2-with-registers-base, ...)",
        ("dinov2_with_registers",),
        "dinov2_with_registers",
        _hf_layout("hf-dinov2-registers", "dinov2_with_registers", "encoder.layer", **_DINO),
        drop_path=True,
    ),
)
MODEL_TYPES = {t: f for f in FAMILIES for t in f.model_types}


def _is_hf(name: str) -> bool:
    """Return whether a model name names a transformers model (``hf:...``)."""
    return name.startswith(PREFIX)


def _source(name: str) -> str:
    """Return the hub id or local folder an ``hf:`` name points at; a folder is made absolute."""
    rest = name[len(PREFIX) :].strip()
    if not rest:
        raise UserError(f'model "{name}": write hf:<hub id> (hf:google/vit-base-patch16-224-in21k) or hf:<folder>')
    path = Path(rest).expanduser()
    looks_local = rest.startswith((".", "/", "~")) or path.exists()
    return str(path.resolve()) if looks_local else rest


def _load_config(name: str):
    """Read the transformers config of an ``hf:`` model; UserError when it cannot be read or is unsupported."""
    transformers = _transformers()
    where = _source(name)
    if Path(where).is_absolute() and not (Path(where) / "config.json").is_file():
        raise UserError(f'model "{name}": {where} has no config.json (a folder that save_pretrained wrote)')
    if not Path(where).is_absolute():
        _check_hub_reachable(name, where)
    try:
        config = transformers.AutoConfig.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise UserError(
            f'could not read the transformers config of "{name}" ({_one_line(exc)}); with no network, '
            "download the model once or give hf:<local folder>"
        ) from None
    if config.model_type not in MODEL_TYPES:
        raise UserError(
            f'"{name}" is a transformers {config.model_type} model; the transformers families supported are '
            f"{', '.join(f.name + ' (' + '/'.join(f.model_types) + ')' for f in FAMILIES)}"
        )
    return config


def _check_hub_reachable(name: str, hub_id: str) -> None:
    """Raise UserError unless a hub id is cached or the hub answers now, before transformers' own retries."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
        return
    fix = "download it once with a network (it is then cached), or give hf:<local folder>"
    if hub._offline():
        raise UserError(f'model "{name}" is not in the Hugging Face cache and the hub is off (HF_HUB_OFFLINE); {fix}')
    hub._check_reachable(hub._hub_url(), f'model "{name}": the Hugging Face hub', fix)


def _create(name: str, num_classes: int, *, pretrained: bool, drop_path_rate: float = 0.0) -> HFClassifier:
    """Build an ``hf:`` model with a new head; torch's generator initialises it unless ``pretrained``."""
    config = _load_config(name)
    family = MODEL_TYPES[config.model_type]
    extra: dict[str, Any] = {"num_labels": num_classes}
    if drop_path_rate:
        if not family.drop_path:
            raise UserError(f"drop_path: {family.name} models have no stochastic depth; leave drop_path at 0")
        extra["drop_path_rate"] = drop_path_rate
    cls = _classifier_class(config)
    with quieted("transformers"):
        if pretrained:
            try:
                model = cls.from_pretrained(_source(name), ignore_mismatched_sizes=True, **extra)
            except OSError as exc:
                raise UserError(f'could not load the weights of "{name}": {_one_line(exc)}') from None
        else:
            for key, value in extra.items():
                setattr(config, key, value)
            model = cls(config)
    return HFClassifier(model, _data_config(name, config), name)


def _classifier_class(config) -> type:
    """Return the config's image-classification class: the one ``architectures`` names, else the type's first."""
    transformers = _transformers()
    mapped = transformers.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING[type(config)]
    options = mapped if isinstance(mapped, (tuple, list)) else (mapped,)
    named = [c for c in options if c.__name__ in (config.architectures or ())]
    return (named or list(options))[0]


def _data_config(name: str, config=None) -> dict[str, Any]:
    """Return timm's data config of an ``hf:`` model, from its image processor, else its config and type."""
    config = config if config is not None else _load_config(name)
    processor = _processor(name)
    size = config.image_size if isinstance(config.image_size, int) else max(config.image_size)
    crop = processor.get("crop_size") or processor.get("size") or {}
    side = crop.get("height") or crop.get("shortest_edge") or size
    resize = (processor.get("size") or {}).get("shortest_edge")
    mean, std = MODEL_TYPES[config.model_type].normalisation
    return {
        "input_size": (3, int(side), int(side)),
        "interpolation": _RESAMPLE.get(processor.get("resample"), "bilinear"),
        "mean": tuple(processor.get("image_mean") or mean),
        "std": tuple(processor.get("image_std") or std),
        "crop_pct": float(side / resize) if resize and processor.get("do_center_crop") else 1.0,
        "crop_mode": "center",
    }


def _processor(name: str) -> dict[str, Any]:
    """Read the image processor's settings; empty when there are none."""
    transformers = _transformers()
    try:
        settings, _ = transformers.ImageProcessingMixin.get_image_processor_dict(_source(name))
    except (OSError, ValueError):
        return {}
    return settings


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError('hf: models need transformers: pip install -e ".[hf]"') from None
    return transformers


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


# The files a transformers folder's weights lie in (save_pretrained's, sharded or not; safetensors or torch's).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def _check_weights(name: str) -> None:
    """Raise UserError when an ``hf:`` folder to be loaded pretrained holds no weights; hub ids are not checked."""
    where = Path(_source(name))
    if where.is_absolute() and not any((where / f).is_file() for f in WEIGHT_FILES):
        raise UserError(
            f'model "{name}": {where} has no weights ({", ".join(WEIGHT_FILES)}); give the folder save_pretrained '
            "wrote with its weights, or train the model from scratch (pretrained=false)"
        )
