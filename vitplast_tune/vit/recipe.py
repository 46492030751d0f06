"""A finetuning recipe's pieces, all timm's: the training loss (``LabelSmoothingCrossEntropy``; with mixup or cutmix,
``timm.data.Mixup``'s soft targets and ``SoftTargetCrossEntropy``), the exponential moving average of the weights
(``timm.utils.ModelEmaV3``), and the checks of the recipe's settings that need timm or the model's family.

The settings are ``FinetuneConfig`` fields (config.py): ``grad_accum_steps``, ``label_smoothing``, ``mixup``,
``cutmix``, ``mixup_prob``, ``mixup_switch_prob``, ``ema_decay``, ``drop_path`` and ``auto_augment``; each left at
its default changes nothing. Mixup draws from a seed per batch (``mix_seed``), so that a resumed run mixes as it
would have.
"""

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
    """The training loss of a recipe: its targets (mixed or not) and its criterion."""

    mixup: object | None  # timm.data.Mixup when mixup or cutmix is on
    criterion: nn.Module | None  # None: plain cross-entropy

    def targets(self, images: Tensor, labels: Tensor, seed: int) -> tuple[Tensor, Tensor]:
        """The batch mixed as the recipe says (from ``seed``) and its targets: soft ones when mixed, else the labels."""
        if self.mixup is None:
            return images, labels
        with transforms.seeded(seed):  # timm's Mixup draws from numpy's and Python's generators
            return self.mixup(images, labels)

    def __call__(self, logits: Tensor, targets: Tensor) -> Tensor:
        """The mean loss of a batch's logits (float32) against its targets."""
        if self.criterion is None:
            return F.cross_entropy(logits, targets)
        return self.criterion(logits, targets)


def training_loss(cfg: FinetuneConfig, num_classes: int) -> Loss:
    """The loss a run of ``cfg`` trains with (``num_classes``: the head's): cross-entropy with ``label_smoothing``,
    on batches mixed by mixup / cutmix when ``mixup`` or ``cutmix`` is on."""
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


def mix_seed(seed: int, step: int, micro: int, rank: int = 0) -> int:
    """The seed of mixup's draws for micro-batch ``micro`` of optimizer step ``step`` on data-parallel rank ``rank``."""
    return int(np.random.SeedSequence([seed, step, micro, rank, 0x6D6978]).generate_state(1)[0])


def weight_average(cfg: FinetuneConfig, model: nn.Module):
    """timm's ``ModelEmaV3`` of ``model`` with decay ``cfg.ema_decay`` (None when the recipe has no EMA): a copy of the
    model whose weights follow the trained ones, updated after every optimizer step."""
    if cfg.ema_decay is None:
        return None
    from timm.utils import ModelEmaV3

    return ModelEmaV3(model, decay=cfg.ema_decay)


def check(cfg: FinetuneConfig) -> None:
    """Raise UserError for recipe settings that need timm or the model's family to check: an ``auto_augment`` policy
    that timm's transform factory cannot parse, or ``drop_path`` on a family without stochastic depth."""
    if cfg.auto_augment is not None:
        _check_policy(cfg.auto_augment)
    if cfg.drop_path > 0:
        from vitplast_tune.vit import models

        family = models.family_of_name(cfg.model)
        if not family.drop_path:
            raise UserError(f"drop_path {cfg.drop_path}: {family.name} models have no stochastic depth; leave it at 0")


def _check_policy(policy: str) -> None:
    """Build timm's transform for ``policy`` once (it parses the policy string); UserError with timm's reason."""
    from timm.data import create_transform

    try:
        create_transform(32, is_training=True, auto_augment=policy)
    except (AssertionError, ValueError, KeyError, IndexError) as exc:
        raise UserError(
            f'auto_augment "{policy}" is not a policy timm understands ({exc or type(exc).__name__}); e.g. '
            '"rand-m9-mstd0.5-inc1" (RandAugment), "original" (AutoAugment), "augmix-m5-w4-d2" (AugMix)'
        ) from None


def accumulate_micro(loss: Tensor, steps: int) -> Tensor:
    """A micro-batch's share of its optimizer step's loss (``steps`` micro-batches per step: their mean)."""
    return loss / steps if steps > 1 else loss
