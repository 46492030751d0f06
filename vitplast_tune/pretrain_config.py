"""Hold how the offline testbed ViT is pretrained, in plain values without torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from vitplast_tune.errors import UserError
from vitplast_tune.type_checks import check_types


@dataclass
class PretrainConfig:
    """Hold how the offline testbed ViT is pretrained on generated fractals; the defaults made the shipped one.

    Attributes:
        seed: The seed of the initialisation, batch order and fractal variations.
        data_seed: The seed of the fractal class systems; 0 matches the 'fractals' dataset.
        steps: Optimizer steps.
        batch_size: Images per step.
        lr: The peak AdamW learning rate.
        weight_decay: AdamW's weight decay on matrices.
        warmup_steps: Linear warm-up steps before the cosine decay.
        label_smoothing: The label smoothing of the cross-entropy.
        num_classes: Fractal classes; the shipped config expects 64.
        images_per_class: Training fractals per class, generated in memory.
        heldout_per_class: Held-out fractals per class for the accuracy check.
        threads: Torch CPU threads; fixed for reproducibility.
        log_every: Print progress every this many steps; held-out accuracy every 10x.
    """

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

    def validate(self) -> PretrainConfig:
        """Check every setting's type and that it can pretrain.

        Returns:
            The settings themselves.
        """
        check_types(self)
        at_least = dict(
            steps=1, batch_size=1, num_classes=2, images_per_class=1, heldout_per_class=1, threads=1, log_every=1
        )
        at_least.update(seed=0, data_seed=0, warmup_steps=0)
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise UserError(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(self, name)}")
        if not self.lr > 0:
            raise UserError(f"--lr must be positive, got {self.lr}")
        if self.weight_decay < 0:
            raise UserError(f"--weight-decay must not be negative, got {self.weight_decay}")
        if not 0 <= self.label_smoothing < 1:
            raise UserError(f"--label-smoothing must lie in [0, 1), got {self.label_smoothing}")
        if self.batch_size > self.num_classes * self.images_per_class:
            raise UserError(
                f"--batch-size {self.batch_size} is larger than the {self.num_classes * self.images_per_class} "
                "training images (--num-classes x --images-per-class)"
            )
        return self
