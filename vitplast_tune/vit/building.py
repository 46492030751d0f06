"""Build what a finetuning run trains: its model, its seeded splits, its hardware settings and its forward pass."""

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
from vitplast_tune.vit.evaluation import _eval_batch_size, autocast
from vitplast_tune.vit.families.registry import family_of


def create_run_model(cfg: FinetuneConfig, num_classes: int | None = None) -> nn.Module:
    """Build the model a run of ``cfg`` starts from, with a new head of ``num_classes`` seeded by ``cfg.seed``."""
    torch.manual_seed(cfg.seed)
    if num_classes is None:
        num_classes = datasets.num_classes(cfg.dataset, data_dir=cfg.data_dir, download=cfg.download)
    return models.create_model(
        cfg.model, num_classes, pretrained=cfg.pretrained, weights=cfg.weights, drop_path_rate=cfg.drop_path
    )


def build_run(cfg: FinetuneConfig, decoded: InMemory | None = None) -> tuple[nn.Module, Splits]:
    """Build a run's model and its seeded splits, as ``finetune`` trains them."""
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


def _use_hardware(cfg: FinetuneConfig, device: torch.device) -> None:
    """Set torch's CPU threads and, on CUDA with ``cuda_options``, TF32 matmuls."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.cuda_options


def _loader_workers(cfg: FinetuneConfig, splits: Splits) -> int:
    """Return a run's DataLoader workers: none for in-memory data, else ``num_workers`` or one per CPU up to 8."""
    if _in_memory(splits):
        return 0
    return cfg.num_workers if cfg.num_workers >= 0 else min(max(cfg.threads, 1), 8)


def _in_memory(splits: Splits) -> bool:
    """Return whether every split is held in memory."""
    return all(isinstance(d, (SmallImages, TensorDataset)) for d in (splits.train, splits.val, splits.test))


class HeadOnTokens(nn.Module):
    """A linear probe's trainable part as a module: the final norm, pooling and head on cached tokens."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.family = family_of(model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return the logits of cached ``tokens``."""
        return self.family.head(self.model, tokens)


def _forward_pass(
    cfg: FinetuneConfig, model: nn.Module, splits: Splits, *, device: torch.device, precision: str
) -> tuple[Splits, nn.Module, float]:
    """Return the splits a run trains on, its forward module, and the seconds spent caching features."""
    family = family_of(model)
    probe = not components.parse_subset(cfg.components)
    if cfg.cache_features and probe and family.cache_features and _in_memory(splits):
        caching = time.perf_counter()
        splits = _backbone_features(model, splits, device=device, batch_size=cfg.batch_size, precision=precision)
        return splits, HeadOnTokens(model), time.perf_counter() - caching
    return splits, model, 0.0


@torch.inference_mode()
def _backbone_features(
    model: nn.Module, splits: Splits, *, device: torch.device, batch_size: int, precision: str
) -> Splits:
    """Pass each split once through the frozen backbone, under the evaluation transform; keep what the head reads."""
    model.eval()
    family = family_of(model)
    keep = family.head_tokens(model)

    def features(dataset: SmallImages) -> TensorDataset:
        evaluation = SmallImages(dataset.images, dataset.labels, dataset.indices, dataset.data_config, train=False)
        out, labels = [], []
        for x, y in eval_batches(evaluation, _eval_batch_size(batch_size), device=device):
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
