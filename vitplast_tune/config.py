"""Hold what one finetuning run is set to and where files live by default, in plain values without torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from vitplast_tune import components, environment
from vitplast_tune.errors import UserError, did_you_mean
from vitplast_tune.type_checks import _describe_parsed, _parse_typed, check_types, field_types

TESTBED_MODEL = "vit_testbed_patch8_32.fractal"  # the offline default (vit/models.py registers it with timm)
# The paper's checkpoint: Google's ViT-B/16 trained on ImageNet-21k, as timm converted it (what the paper's reference
# code loads as google/vit-base-patch16-224-in21k); augreg_in21k is another training of it.
PAPER_MODEL = "vit_base_patch16_224.orig_in21k"
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"  # shipped with the package
TESTBED_WEIGHTS = WEIGHTS_DIR / "vit_testbed_patch8_32.fractal.safetensors"
# The second testbed: the same architecture and recipe, pretrained from seed 1 (vitplast-pretrain --seed 1).
TESTBED_SEED1_MODEL = "vit_testbed_patch8_32.fractal_seed1"
TESTBED_SEED1_WEIGHTS = WEIGHTS_DIR / "vit_testbed_patch8_32.fractal_seed1.safetensors"


CACHE_ENV = "VITPLAST_CACHE_DIR"  # overrides the cache root


def cache_dir() -> Path:
    """Find where generated files live (datasets, image caches, plasticity reports).

    ``$VITPLAST_CACHE_DIR``, else ``~/.cache/vitplast_tune``; UserError when it is a file or lies under one.
    """
    given = (environment.read(CACHE_ENV) or "").strip()
    folder = Path(given or Path.home() / ".cache" / "vitplast_tune").expanduser()
    existing = next((p for p in (folder, *folder.parents) if p.exists()), folder)
    if given and not existing.is_dir():
        where = "" if existing == folder else f" lies under {existing}, which"
        raise UserError(f"{CACHE_ENV}={given}{where} is a file; point it at a folder (it is made if missing)")
    return folder


def default_data_dir() -> Path:
    """Find where datasets live without ``--data-dir``: the cache's ``data`` folder."""
    return cache_dir() / "data"


OPTIMIZERS = ("sgd", "adamw")  # SGD with classical momentum, AdamW; both built by timm.optim.create_optimizer_v2
# Mixed precision of training and evaluation: auto picks by device (vit/devices.py resolve_precision).
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
# The policies of timm's transform factory (create_transform(auto_augment=...)), by the first word of their string.
AUTO_AUGMENT_KINDS = ("rand", "augmix", "original", "originalr", "v0", "v0r", "3a")
# How plasticity is measured (vit/plasticity.py): the paper's definition (every component applied to the embedding
# output), or each component on its real input inside the forward pass.
PLASTICITY_VARIANTS = ("paper", "in_network")


def check_variant(variant: str) -> str:
    """Check that ``variant`` is one of ``PLASTICITY_VARIANTS``."""
    if variant not in PLASTICITY_VARIANTS:
        raise UserError(
            f'unknown plasticity variant "{variant}"{did_you_mean(variant, PLASTICITY_VARIANTS)}; '
            f"use one of {', '.join(PLASTICITY_VARIANTS)}"
        )
    return variant


@dataclass(frozen=True)
class PlasticityInputs:
    """Hold what a plasticity measurement reads, which keys its cached report.

    ``weights`` None loads no file; ``reference`` is the pretraining distribution's dataset; ``data_dir`` None is the
    default data directory; ``max_pairs`` None measures every image pair.
    """

    model_name: str
    weights: str | Path | None
    pretrained: bool
    dataset: str
    reference: str
    reference_split: str
    data_dir: str | Path | None
    variant: str
    max_pairs: int | None


@dataclass
class FinetuneConfig:
    """Hold everything one finetuning run needs; a trial's parameters override these fields.

    Attributes:
        model: The timm model's name, or ``hf:<hub id or folder>`` (transformers).
        weights: Local weights for ``model`` (safetensors or torch state dict), instead of the hub.
        pretrained: Whether to load pretrained weights.
        dataset: The dataset's name.
        data_dir: Where the dataset lies (None: the default cache).
        download: Download the dataset when missing.
        image_cache: Above 0, decode a JPEG dataset once, its shorter side resized to this many pixels.
        val_fraction: The share of the training split held out for validation.
        augment: The training augmentation recipe (paper, light or none); None or "auto" takes the dataset's default.
        components: The subset trained and each component's method, e.g. "mha:lora+fc1".
        blocks: The block indices the block components train in (None: ``depth`` decides).
        depth: The blocks they train in: "all", "first", "middle", "last" or a range "i-j".
        lora_rank: The rank r of the LoRA adapters.
        lora_alpha: The LoRA scaling alpha; the adapter's update is (alpha / r) * B @ A.
        optimizer: The optimizer's name.
        lr: The peak learning rate.
        momentum: The optimizer's momentum.
        weight_decay: The weight decay, never on biases, norms and position or class tokens.
        layer_decay: Layer-wise learning-rate decay, as timm's; None turns it off.
        batch_size: Images per micro-batch, over all of a trial's data-parallel workers together.
        grad_accum_steps: Micro-batches per optimizer step.
        max_steps: Optimizer steps.
        warmup_steps: Warm-up steps of the learning rate.
        warmup_fraction: When set, warm up for this fraction of ``max_steps`` instead.
        eval_every: Evaluate every this many steps.
        checkpoint_every: Save a checkpoint every this many evaluations, and whenever the best accuracy improves.
        grad_clip: The gradient norm clipped to.
        label_smoothing: The label smoothing of the cross-entropy's targets.
        mixup: Mixup's Beta(alpha, alpha); 0 turns it off.
        cutmix: CutMix's Beta(alpha, alpha); 0 turns it off.
        mixup_prob: The probability that a batch is mixed at all.
        mixup_switch_prob: With both on, the probability that a mixed batch is cut, not blended.
        ema_decay: The decay of an EMA of the weights, evaluated and kept as the best; None: no EMA.
        drop_path: Stochastic depth, rising linearly to this over the blocks.
        auto_augment: A timm policy after the crop, e.g. rand-m9-mstd0.5-inc1; None: off.
        seed: The training seed.
        threads: Torch's threads (0: torch's default).
        num_workers: DataLoader worker processes (-1: automatic, from ``threads``).
        compile: Compile the forward pass with ``torch.compile``.
        grad_checkpointing: Recompute each block's activations in the backward pass.
        precision: auto picks bf16 where the GPU has it, else fp16 on CUDA, fp32 on CPU.
        cuda_options: Use TF32 matmuls and fused optimizers on CUDA.
        cache_features: Let a linear probe on in-memory data train its head on cached features.
        eval_test: Evaluate the best weights on the test split at the end.
    """

    model: str = TESTBED_MODEL
    weights: str | None = None
    pretrained: bool = True
    dataset: str = "digits"
    data_dir: str | None = None
    download: bool = False
    image_cache: int = 0
    val_fraction: float = 0.2
    augment: str | None = None
    components: str = "all"
    blocks: list[int] | None = None
    depth: str = "all"
    lora_rank: int = 8
    lora_alpha: float = 16.0
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    layer_decay: float | None = None
    batch_size: int = 64
    grad_accum_steps: int = 1
    max_steps: int = 400
    warmup_steps: int = 40
    warmup_fraction: float | None = None
    eval_every: int = 50
    checkpoint_every: int = 1
    grad_clip: float = 1.0
    # The recipe's settings (vit/recipe.py) change nothing at their defaults.
    label_smoothing: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    ema_decay: float | None = None
    drop_path: float = 0.0
    auto_augment: str | None = None
    seed: int = 0
    threads: int = 0
    num_workers: int = -1
    compile: bool = False
    grad_checkpointing: bool = False
    precision: str = "auto"
    cuda_options: bool = True
    cache_features: bool = True
    eval_test: bool = True

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FinetuneConfig:
        """Build from a dict, rejecting unknown keys with a suggestion.

        Args:
            values: The settings, by field name.

        Returns:
            The settings, not yet validated.
        """
        _check_names(values)
        return cls(**values)

    def merged(self, values: dict[str, Any]) -> FinetuneConfig:
        """Copy the settings with ``values`` applied, rejecting unknown keys with a suggestion.

        Args:
            values: The settings to change, by field name.

        Returns:
            The copy.
        """
        _check_names(values)
        return replace(self, **values)

    def validate(self) -> FinetuneConfig:
        """Check every setting's type and that it can train.

        Returns:
            The settings themselves.
        """
        check_types(self)
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
        for name in ("lr", "batch_size", "max_steps", "eval_every", "checkpoint_every"):
            if not getattr(self, name) > 0:
                raise UserError(f"{name} must be positive, got {getattr(self, name)}")
        if self.precision not in PRECISIONS:
            raise UserError(
                f'unknown precision "{self.precision}"{did_you_mean(self.precision, PRECISIONS)}; use one of {", ".join(PRECISIONS)}'
            )
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            raise UserError(f"layer_decay must lie in (0, 1], got {self.layer_decay}")
        for name in ("warmup_steps", "weight_decay", "momentum", "grad_clip", "threads", "image_cache", "seed"):
            if getattr(self, name) < 0:
                raise UserError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.num_workers < -1:
            raise UserError(f"num_workers must be -1 (automatic), 0 or more, got {self.num_workers}")
        if self.blocks is not None and (not self.blocks or min(self.blocks) < 0):
            raise UserError(f"blocks must be a non-empty list of block indices (0, 1, ...), got {self.blocks}")
        if self.warmup_fraction is not None and not 0 <= self.warmup_fraction < 1:
            raise UserError(f"warmup_fraction must lie in [0, 1), got {self.warmup_fraction}")
        if not 0 < self.val_fraction < 1:
            raise UserError(f"val_fraction must lie in (0, 1), got {self.val_fraction}")
        self._validate_recipe()
        return self

    def _validate_recipe(self) -> None:
        """Check the recipe's settings."""
        if self.grad_accum_steps < 1:
            raise UserError(f"grad_accum_steps must be at least 1, got {self.grad_accum_steps}")
        for name in ("label_smoothing", "drop_path"):
            if not 0 <= getattr(self, name) < 1:
                raise UserError(f"{name} must lie in [0, 1), got {getattr(self, name)}")
        for name in ("mixup", "cutmix"):
            if getattr(self, name) < 0:
                raise UserError(f"{name} (its Beta alpha) must not be negative, got {getattr(self, name)}; 0 is off")
        for name in ("mixup_prob", "mixup_switch_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise UserError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if (self.mixup > 0 or self.cutmix > 0) and self.batch_size % 2:
            raise UserError(
                f"mixup and cutmix pair each image with another: batch_size must be even, got {self.batch_size}"
            )
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise UserError(f"ema_decay must lie in (0, 1) (e.g. 0.999), or be null for no EMA; got {self.ema_decay}")
        if self.auto_augment is not None:
            kind = self.auto_augment.split("-", 1)[0]
            if kind not in AUTO_AUGMENT_KINDS:
                raise UserError(
                    f'unknown auto_augment policy "{self.auto_augment}"{did_you_mean(kind, AUTO_AUGMENT_KINDS)}; timm '
                    'reads e.g. "rand-m9-mstd0.5-inc1" (RandAugment), "original" (AutoAugment), "augmix-m5-w4-d2"'
                )

    @property
    def warmup(self) -> int:
        """Return the warm-up steps: ``warmup_fraction`` of ``max_steps`` when set, else ``warmup_steps``."""
        if self.warmup_fraction is None:
            return self.warmup_steps
        return round(self.warmup_fraction * self.max_steps)

    def block_indices(self, num_blocks: int) -> list[int] | None:
        """Find the blocks the block components train in.

        Args:
            num_blocks: The model's number of blocks.

        Returns:
            The block indices, or None for every block.
        """
        return self.blocks if self.blocks is not None else components.depth_blocks(self.depth, num_blocks)

    def to_dict(self) -> dict[str, Any]:
        """Give the settings as a plain dict.

        Returns:
            Every field, by name.
        """
        return asdict(self)


FINALIST_KEY = "finalist"  # in a finalist trial's config: which finalist it is (``space.finalists``), not a setting
REFERENCE_KEY = "reference"  # in a baseline's reference trial's config: which one it is (``space.baselines``)
NOT_SETTINGS = (*components.ENCODING_KEYS, FINALIST_KEY, REFERENCE_KEY)  # a trial's config besides its settings


def trial_config(config: dict[str, Any], settings: FinetuneConfig) -> FinetuneConfig:
    """Make a trial's settings, not yet validated: its sampled parameters (encodings and marks left out) over the
    search's.
    """
    return settings.merged({k: v for k, v in config.items() if k not in NOT_SETTINGS})


# ----------------------------------------------------------------------------- --set KEY=VALUE


def parse_setting(text: str) -> tuple[str, Any]:
    """Parse ``KEY=VALUE`` (``--set``) as a field's name and its value, by the field's type.

    Raises UserError when the text is no setting or the value is not of its type.
    """
    key, sep, raw = text.partition("=")
    name = key.strip().replace("-", "_")
    if not sep or not name:
        raise UserError(f"--set {text}: write KEY=VALUE with a trial setting as KEY, e.g. --set lr=0.05")
    try:
        _check_names({name: None})
    except UserError as exc:
        raise UserError(f"--set {text}: {exc}") from None
    kind = field_types(FinetuneConfig)[name]
    try:
        return name, _parse_typed(raw.strip(), kind)
    except ValueError:
        raise UserError(f"--set {text}: {name} takes {_describe_parsed(kind)}, not {raw.strip()!r}") from None


def _check_names(values: dict[str, Any]) -> None:
    names = {f.name for f in fields(FinetuneConfig)}
    for key in values:
        if key not in names:
            raise UserError(f'unknown setting "{key}"{did_you_mean(key, names)}')
