"""What a finetuning run trains: its model (pretrained weights, a new seeded head), its seeded splits, the hardware
settings, and its forward pass (for a linear probe on in-memory data: the head on the backbone's cached features)."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from vitplast_tune import components
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data import datasets, transforms
from vitplast_tune.data.batches import eval_batches
from vitplast_tune.data.decoded import InMemory
from vitplast_tune.data.splits import SmallImages, Splits
from vitplast_tune.vit import models
from vitplast_tune.vit.evaluation import autocast, eval_batch_size
from vitplast_tune.vit.families.registry import family_of


def create_run_model(cfg: FinetuneConfig, num_classes: int | None = None) -> nn.Module:
    """The model a run of ``cfg`` starts from.

    Args:
        cfg: the run's settings: its pretrained weights (or, with ``pretrained`` off, an initialisation seeded by
            ``cfg.seed``) and ``drop_path``.
        num_classes: the classes of the new head, initialised from ``cfg.seed`` (default: the dataset's).

    Returns:
        The timm model.
    """
    torch.manual_seed(cfg.seed)
    if num_classes is None:
        num_classes = datasets.num_classes(cfg.dataset, data_dir=cfg.data_dir, download=cfg.download)
    return models.create_model(
        cfg.model, num_classes, pretrained=cfg.pretrained, weights=cfg.weights, drop_path_rate=cfg.drop_path
    )


def build_run(cfg: FinetuneConfig, decoded: InMemory | None = None) -> tuple[nn.Module, Splits]:
    """A run's model (``create_run_model``) and its seeded splits, as ``finetune`` trains them.

    Args:
        cfg: the run's settings.
        decoded: the dataset already decoded (shared by a search), or None to load it.

    Returns:
        (model, splits).
    """
    model = create_run_model(cfg)
    augment = transforms.with_auto_augment(datasets.resolve_augmentation(cfg.dataset, cfg.augment), cfg.auto_augment)
    splits = datasets.load_dataset(
        cfg.dataset,
        models.data_config(model),
        data_dir=cfg.data_dir,
        download=cfg.download,
        seed=cfg.seed,
        val_fraction=cfg.val_fraction,
        decoded=decoded,
        image_cache=cfg.image_cache,
        augment=augment,
    )
    return model, splits


def use_hardware(cfg: FinetuneConfig, device: torch.device) -> None:
    """Set the CPU threads to the trial's CPUs and, on CUDA with ``cuda_options``, TF32 matmuls.

    Args:
        cfg: the run's settings (``threads``, ``cuda_options``).
        device: where the run trains.
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.cuda_options


def loader_workers(cfg: FinetuneConfig, splits: Splits) -> int:
    """The DataLoader workers of a run: none for in-memory data, else ``num_workers`` or one per CPU (at most 8).

    Args:
        cfg: the run's settings (``num_workers``, ``threads``).
        splits: its splits.

    Returns:
        The number of DataLoader worker processes.
    """
    if in_memory(splits):
        return 0
    return cfg.num_workers if cfg.num_workers >= 0 else min(max(cfg.threads, 1), 8)


def in_memory(splits: Splits) -> bool:
    """Whether every split of ``splits`` is held in memory (small images or cached features)."""
    return all(isinstance(d, (SmallImages, TensorDataset)) for d in (splits.train, splits.val, splits.test))


class HeadOnTokens(nn.Module):
    """The trainable part of a linear probe as a module: final norm, pooling and head, on cached tokens (its
    parameters are the whole model's, the backbone's frozen)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.family = family_of(model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The logits of cached ``tokens``."""
        return self.family.head(self.model, tokens)


def forward_pass(
    cfg: FinetuneConfig, model: nn.Module, splits: Splits, *, device: torch.device, precision: str
) -> tuple[Splits, nn.Module, float]:
    """The splits a run trains on and the module of its forward pass.

    A linear probe on in-memory data trains its head on the backbone's cached features (the splits become them,
    ``TensorDataset``s); otherwise the model (``loop.prepare`` compiles it with ``cfg.compile``).

    Args:
        cfg: the run's settings (``components``, ``cache_features``, ``compile``, ``batch_size``).
        model: the run's model, frozen but for its subset, on ``device``.
        splits: its splits.
        device: where it trains.
        precision: bf16, fp16 or fp32, resolved on ``device``.

    Returns:
        (splits, forward module, seconds spent caching features).
    """
    family = family_of(model)
    probe = not components.parse_subset(cfg.components)
    if cfg.cache_features and probe and family.cache_features and in_memory(splits):
        caching = time.perf_counter()
        splits = _backbone_features(model, splits, device=device, batch_size=cfg.batch_size, precision=precision)
        return splits, HeadOnTokens(model), time.perf_counter() - caching
    return splits, model, 0.0


@torch.inference_mode()
def _backbone_features(
    model: nn.Module, splits: Splits, *, device: torch.device, batch_size: int, precision: str
) -> Splits:
    """Each split passed once through the frozen backbone: the tokens before the final norm.

    Every split goes through the evaluation transform (the features of a linear probe are computed
    once, so training crops and flips do not apply). Token pooling needs only the prefix tokens
    (the family's ``head_tokens``); other pooling keeps every token.
    """
    model.eval()
    family = family_of(model)
    keep = family.head_tokens(model)

    def features(dataset: SmallImages) -> TensorDataset:
        evaluation = SmallImages(dataset.images, dataset.labels, dataset.indices, dataset.data_config, train=False)
        out, labels = [], []
        for x, y in eval_batches(evaluation, eval_batch_size(batch_size), device=device):
            labels.append(y.cpu())
            with autocast(device, precision):
                tokens = family.features(model, x)
            out.append(
                (tokens[:, :keep] if keep else tokens).to(torch.float32, copy=True)
            )  # a copy: a view would keep every token
        return TensorDataset(torch.cat(out), torch.cat(labels))

    cached = Splits(features(splits.train), features(splits.val), features(splits.test), splits.num_classes)
    model.train()
    return cached
