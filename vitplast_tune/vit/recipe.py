"""Build a finetuning recipe's loss and weight average from timm, and check the recipe's settings."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data import transforms
from vitplast_tune.errors import UserError


@dataclass
class Loss:
    """A recipe's training loss: its mixup (None when off) and its criterion (None for plain cross-entropy)."""

    mixup: object | None  # timm.data.Mixup when mixup or cutmix is on
    criterion: nn.Module | None  # None: plain cross-entropy

    def targets(self, images: Tensor, labels: Tensor, seed: int) -> tuple[Tensor, Tensor]:
        """Mix the batch from ``seed`` as the recipe says, and return it with its targets."""
        if self.mixup is None:
            return images, labels
        with transforms.seeded(seed):  # timm's Mixup draws from numpy's and Python's generators
            return self.mixup(images, labels)

    def __call__(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Return the mean loss of a batch's logits against its targets."""
        if self.criterion is None:
            return F.cross_entropy(logits, targets)
        return self.criterion(logits, targets)


def training_loss(cfg: FinetuneConfig, num_classes: int) -> Loss:
    """Build the loss a run of ``cfg`` trains with: cross-entropy with label smoothing, mixup and cutmix."""
    from timm.data import Mixup
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    if cfg.mixup > 0 or cfg.cutmix > 0:
        mixup = Mixup(
            mixup_alpha=cfg.mixup,
            cutmix_alpha=cfg.cutmix,
            prob=cfg.mixup_prob,
            switch_prob=cfg.mixup_switch_prob,
            mode="batch",
            label_smoothing=cfg.label_smoothing,
            num_classes=num_classes,
        )
        return Loss(mixup, SoftTargetCrossEntropy())
    if cfg.label_smoothing > 0:
        return Loss(None, LabelSmoothingCrossEntropy(smoothing=cfg.label_smoothing))
    return Loss(None, None)


def _mix_seed(seed: int, step: int, micro: int, rank: int = 0) -> int:
    """Return the seed of mixup's draws for one micro-batch of one step on one rank."""
    return int(np.random.SeedSequence([seed, step, micro, rank, 0x6D6978]).generate_state(1)[0])


def weight_average(cfg: FinetuneConfig, model: nn.Module):
    """Return timm's ``ModelEmaV3`` of ``model``, or None when the recipe has no EMA."""
    if cfg.ema_decay is None:
        return None
    from timm.utils import ModelEmaV3

    return ModelEmaV3(model, decay=cfg.ema_decay)


def check(cfg: FinetuneConfig) -> None:
    """Refuse an ``auto_augment`` policy timm cannot parse, or ``drop_path`` on a family without stochastic depth."""
    if cfg.auto_augment is not None:
        _check_policy(cfg.auto_augment)
    if cfg.drop_path > 0:
        from vitplast_tune.vit import models

        family = models._family_of_name(cfg.model)
        if not family.drop_path:
            raise UserError(f"drop_path {cfg.drop_path}: {family.name} models have no stochastic depth; leave it at 0")


def _check_policy(policy: str) -> None:
    """Refuse a policy timm cannot parse, with timm's reason."""
    from timm.data import create_transform

    try:
        create_transform(32, is_training=True, auto_augment=policy)
    except (AssertionError, ValueError, KeyError, IndexError) as exc:
        raise UserError(
            f'auto_augment "{policy}" is not a policy timm understands ({exc or type(exc).__name__}); e.g. '
            '"rand-m9-mstd0.5-inc1" (RandAugment), "original" (AutoAugment), "augmix-m5-w4-d2" (AugMix)'
        ) from None
