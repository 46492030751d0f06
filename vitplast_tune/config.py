"""What one finetuning run is set to (``FinetuneConfig``) and where files live by default: plain values, no
torch, so that a search's driver validates settings without importing what only trials need.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from vitplast_tune import components
from vitplast_tune.errors import UserError, did_you_mean

TESTBED_MODEL = "vit_testbed_patch8_32.fractal"  # the offline default (vit/models.py registers it with timm)
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"  # shipped with the package
TESTBED_WEIGHTS = WEIGHTS_DIR / "vit_testbed_patch8_32.fractal.safetensors"


CACHE_ENV = "VITPLAST_CACHE_DIR"  # overrides the cache root


def cache_dir() -> Path:
    """Where generated files live (datasets, image caches, plasticity reports): ``$VITPLAST_CACHE_DIR``, else
    ``~/.cache/vitplast_tune``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "vitplast_tune").expanduser()


def default_data_dir() -> Path:
    """Where datasets live when ``--data-dir`` is not given: ``~/.cache/vitplast_tune/data``."""
    return cache_dir() / "data"


OPTIMIZERS = ("sgd", "adamw")
# How plasticity is measured (vit/plasticity.py): the paper's definition (every component applied to the embedding
# output), or each component on its real input inside the forward pass.
PLASTICITY_VARIANTS = ("paper", "in_network")


def check_variant(variant: str) -> str:
    """Raise UserError unless ``variant`` is one of ``PLASTICITY_VARIANTS``; return it."""
    if variant not in PLASTICITY_VARIANTS:
        raise UserError(
            f'unknown plasticity variant "{variant}"{did_you_mean(variant, PLASTICITY_VARIANTS)}; '
            f"use one of {', '.join(PLASTICITY_VARIANTS)}"
        )
    return variant


@dataclass
class FinetuneConfig:
    """Everything one finetuning run needs; a search trial's parameters override these fields."""

    model: str = TESTBED_MODEL
    weights: str | None = None
    pretrained: bool = True
    dataset: str = "digits"
    data_dir: str | None = None
    download: bool = False
    image_cache: int = 0  # JPEG datasets: > 0 decodes them once, shorter side resized to this many px (image_cache.py)
    val_fraction: float = 0.2
    components: str = "all"  # a subset and each component's method: "mha:lora+fc1" (components.py)
    blocks: list[int] | None = None  # block indices the block components train in (or ``depth``)
    depth: str = "all"  # "all", "first" / "middle" / "last" (thirds of the blocks) or a range "i-j"
    lora_rank: int = 8  # rank r of the LoRA adapters of components trained by "lora"
    lora_alpha: float = 16.0  # LoRA scaling alpha: the adapter's update is (alpha / r) * B @ A
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int = 64
    max_steps: int = 400
    warmup_steps: int = 40
    warmup_fraction: float | None = None  # when set, warm up for this fraction of max_steps instead of warmup_steps
    eval_every: int = 50
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 0
    num_workers: int = -1
    compile: bool = False
    grad_checkpointing: bool = (
        False  # recompute each block's activations in the backward pass: less memory, more compute
    )
    cuda_options: bool = True  # on CUDA: bf16 autocast, TF32 matmuls, fused optimizers (False: the plain fp32 baseline)
    cache_features: bool = True
    eval_test: bool = True

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FinetuneConfig:
        """Build from a dict (a space file's defaults, a search's record), rejecting unknown keys with a suggestion."""
        _check_names(values)
        return cls(**values)

    def merged(self, values: dict[str, Any]) -> FinetuneConfig:
        """A copy with ``values`` applied (a trial's sampled parameters), rejecting unknown keys with a suggestion."""
        _check_names(values)
        return replace(self, **values)

    def validate(self) -> FinetuneConfig:
        """Raise UserError for values that cannot train; return self."""
        components.parse_subset(self.components)
        components.check_depth(self.depth)
        if self.blocks is not None and self.depth != "all":
            raise UserError(f'give blocks or depth, not both (blocks {self.blocks}, depth "{self.depth}")')
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 1:
            raise UserError(f"lora_rank must be a positive integer, got {self.lora_rank!r}")
        if not self.lora_alpha > 0:
            raise UserError(f"lora_alpha must be positive, got {self.lora_alpha}")
        if self.optimizer not in OPTIMIZERS:
            raise UserError(
                f'unknown optimizer "{self.optimizer}"{did_you_mean(self.optimizer, OPTIMIZERS)}; use one of {", ".join(OPTIMIZERS)}'
            )
        positive = dict(lr=self.lr, batch_size=self.batch_size, max_steps=self.max_steps, eval_every=self.eval_every)
        for name, value in positive.items():
            if not value > 0:
                raise UserError(f"{name} must be positive, got {value}")
        for name in ("warmup_steps", "weight_decay", "momentum", "grad_clip", "threads", "image_cache"):
            if getattr(self, name) < 0:
                raise UserError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.warmup_fraction is not None and not 0 <= self.warmup_fraction < 1:
            raise UserError(f"warmup_fraction must lie in [0, 1), got {self.warmup_fraction}")
        if not 0 < self.val_fraction < 1:
            raise UserError(f"val_fraction must lie in (0, 1), got {self.val_fraction}")
        return self

    @property
    def warmup(self) -> int:
        """Warm-up steps of this run: ``warmup_fraction`` of ``max_steps`` when set, else ``warmup_steps``."""
        if self.warmup_fraction is None:
            return self.warmup_steps
        return round(self.warmup_fraction * self.max_steps)

    def block_indices(self, num_blocks: int) -> list[int] | None:
        """The blocks the block components train in, in a model of ``num_blocks`` blocks (None: every block)."""
        return self.blocks if self.blocks is not None else components.depth_blocks(self.depth, num_blocks)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field."""
        return asdict(self)


@dataclass
class PretrainConfig:
    """How the offline testbed ViT is pretrained on generated fractals (``vit.pretraining.pretrain_testbed``); the
    defaults made the shipped checkpoint. Each field's ``help`` is its command-line help (``vitplast-pretrain``)."""

    seed: int = field(default=0, metadata={"help": "seed of the initialisation, batch order and fractal variations"})
    data_seed: int = field(
        default=0, metadata={"help": "seed of the fractal class systems; 0 matches the 'fractals' dataset"}
    )
    steps: int = field(default=5000, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=128, metadata={"help": "images per step"})
    lr: float = field(default=2e-3, metadata={"help": "peak AdamW learning rate"})
    weight_decay: float = field(default=0.05, metadata={"help": "AdamW weight decay on matrices"})
    warmup_steps: int = field(default=200, metadata={"help": "linear warm-up steps before the cosine decay"})
    label_smoothing: float = field(default=0.1, metadata={"help": "label smoothing of the cross-entropy"})
    num_classes: int = field(default=64, metadata={"help": "fractal classes; the shipped config expects 64"})
    images_per_class: int = field(default=1500, metadata={"help": "training fractals per class, generated in memory"})
    heldout_per_class: int = field(default=50, metadata={"help": "held-out fractals per class for the accuracy check"})
    threads: int = field(default=2, metadata={"help": "torch CPU threads; fixed for reproducibility"})
    log_every: int = field(
        default=100, metadata={"help": "print progress every this many steps; held-out accuracy every 10x"}
    )


def _check_names(values: dict[str, Any]) -> None:
    names = {f.name for f in fields(FinetuneConfig)}
    for key in values:
        if key not in names:
            raise UserError(f'unknown setting "{key}"{did_you_mean(key, names)}')
