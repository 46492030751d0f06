"""Score a model on a split: its accuracy and mean cross-entropy, under autocast."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from vitplast_tune.data.batches import eval_batches
from vitplast_tune.vit.distributed import SINGLE, World, _shard

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: str):
    """Return an autocast context for ``precision`` on ``device``, disabled for fp32."""
    return torch.autocast(device.type, dtype=_DTYPES.get(precision, torch.float32), enabled=precision in _DTYPES)


def _eval_batch_size(batch_size: int) -> int:
    """Return the evaluation batch size: the training one, at least 64."""
    return max(batch_size, 64)


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    dataset: Dataset | Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    batch_size: int,
    device: torch.device,
    num_workers: int = 0,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
    precision: str = "fp32",
    world: World = SINGLE,
    per_image: bool = False,
) -> dict[str, Any]:
    """Score ``model``, or ``forward``, on ``dataset``: its accuracy and mean cross-entropy.

    Each data-parallel worker scores its share of the split (or its batches), and every worker gets the whole split's
    result. ``batch_size`` is the training one (evaluation takes at least 64). Returns ``acc`` and ``loss``; with
    ``per_image`` (one worker only) also ``correct``, a string of 0 and 1 per image.
    """
    forward = model if forward is None else forward  # not `or`: a compiled module has no truth value
    was_training = model.training
    model.eval()
    dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
    sums = torch.zeros(3, device=device, dtype=dtype)  # correct, summed loss, images
    batches = (
        eval_batches(_shard(dataset, world), _eval_batch_size(batch_size), num_workers, device)
        if isinstance(dataset, Dataset)
        else dataset
    )
    hits = []
    for images, labels in batches:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with autocast(device, precision):
            logits = forward(images)
        hit = logits.argmax(-1) == labels
        if per_image:
            hits.append(hit.cpu())
        sums[0] += hit.sum()
        sums[1] += F.cross_entropy(logits.float(), labels, reduction="sum")
        sums[2] += len(labels)
    model.train(was_training)
    correct, loss_sum, count = world.sum(sums).tolist()
    found: dict[str, Any] = {"acc": correct / max(count, 1), "loss": loss_sum / max(count, 1)}
    if per_image and world.size == 1:
        found["correct"] = "".join("1" if h else "0" for h in torch.cat(hits).tolist()) if hits else ""
    return found
