"""Pretrain the offline testbed ViT on generated fractals (the classes of ``fractal_dataset(seed=0)``)."""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import platform
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from vitplast_tune.data.fractals import fractal_dataset
from vitplast_tune.data.transforms import prepare_images
from vitplast_tune.log import get_logger
from vitplast_tune.pretrain_config import PretrainConfig
from vitplast_tune.vit.models import TESTBED_WEIGHTS, data_config
from vitplast_tune.vit.optim import warmup_cosine

TRAIN_INSTANCES = 1000  # instance_seed offsets: train variations, held-out variations
HELDOUT_INSTANCES = 2000

log = get_logger(__name__)


def pretrain_testbed(
    out: str | Path = TESTBED_WEIGHTS, config: PretrainConfig | None = None, *, command: str | None = None
) -> dict[str, Any]:
    """Pretrain the testbed ViT on fractals, and write its weights with their provenance beside them.

    Args:
        out: The safetensors file to write; the provenance goes beside it with a ``.json`` suffix.
        config: The pretraining settings (None: the defaults).
        command: The command line to record (None: this process's).

    Returns:
        The provenance: the command, settings, measurements, the file's digest and size, and the software's versions.
    """
    c = config or PretrainConfig()
    start = time.time()
    torch.set_num_threads(c.threads)
    torch.manual_seed(c.seed)
    out = Path(out).expanduser()
    model = timm.create_model("vit_testbed_patch8_32", pretrained=False, num_classes=c.num_classes)
    train, held = _fractals(c, data_config(model))
    log.info(f"data: {len(train[1])} train / {len(held[1])} held-out fractals in {time.time() - start:.1f}s")
    final_loss = _train(model, c, train, held, start)
    held_acc = _accuracy(model, *held)
    sample = len(held[1]) * 2
    train_acc = _accuracy(model, train[0][:sample], train[1][:sample])
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().float() for k, v in model.state_dict().items()}
    save_file(state, str(out), metadata={"format": "pt"})
    measured = {
        "train_images": len(train[1]),
        "heldout_images": len(held[1]),
        "heldout_accuracy": round(held_acc, 6),
        "train_accuracy_sample": round(train_acc, 6),
        "final_loss": round(final_loss, 6),
        "wall_time_s": round(time.time() - start, 1),
    }
    provenance = _provenance(c, out, measured, command)
    out.with_suffix(".json").write_text(json.dumps(provenance, indent=2) + "\n")
    log.info(f"held-out accuracy {held_acc:.4f}; wrote {out} ({provenance['size_bytes'] / 1e6:.2f} MB)")
    return provenance


Images = tuple[torch.Tensor, torch.Tensor]  # normalised images and their labels


def _fractals(c: PretrainConfig, config: dict[str, Any]) -> tuple[Images, Images]:
    """Render the training and held-out fractals, normalised for the model."""
    size = config["input_size"][-1]
    make = lambda per_class, offset: fractal_dataset(
        c.num_classes, per_class, size, c.data_seed, instance_seed=offset + c.seed
    )
    (train_x, train_y), (held_x, held_y) = (
        make(c.images_per_class, TRAIN_INSTANCES),
        make(c.heldout_per_class, HELDOUT_INSTANCES),
    )
    return (prepare_images(train_x, config), train_y), (prepare_images(held_x, config), held_y)


def _train(model: torch.nn.Module, c: PretrainConfig, train: Images, held: Images, start: float) -> float:
    """Train with AdamW, warm-up and cosine, clipping and random flips; return the smoothed final loss."""
    (train_x, train_y), params = train, list(model.named_parameters())
    decay = [p for n, p in params if p.ndim > 1 and "pos_embed" not in n]
    no_decay = [p for n, p in params if not (p.ndim > 1 and "pos_embed" not in n)]
    groups = [{"params": decay, "weight_decay": c.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=c.lr, betas=(0.9, 0.999))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, c.steps, c.warmup_steps))
    generator = torch.Generator().manual_seed(c.seed)
    per_epoch, order = len(train_y) // c.batch_size, torch.randperm(len(train_y), generator=generator)
    model.train()
    running = 0.0
    for step in range(c.steps):
        b = step % per_epoch
        if b == 0 and step > 0:
            order = torch.randperm(len(train_y), generator=generator)
        idx = order[b * c.batch_size : (b + 1) * c.batch_size]
        flip = torch.rand(len(idx), generator=generator) < 0.5
        images = torch.where(flip.view(-1, 1, 1, 1), train_x[idx].flip(-1), train_x[idx])
        loss = F.cross_entropy(model(images), train_y[idx], label_smoothing=c.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        running = loss.item() if step == 0 else 0.98 * running + 0.02 * loss.item()
        if not math.isfinite(running):
            raise RuntimeError(f"pretraining diverged at step {step}: loss {loss.item()}")
        _log(model, c, step, running, schedule.get_last_lr()[0], held, start)
    return running


def _log(model: torch.nn.Module, c: PretrainConfig, step: int, loss: float, lr: float, held: Images, start: float):
    """Log a line every ``log_every`` steps, with the held-out accuracy every tenth line and at the end."""
    done = step + 1
    if done % c.log_every and done != c.steps:
        return
    line = f"step {done}/{c.steps}  loss {loss:.4f}  lr {lr:.2e}  {time.time() - start:.0f}s"
    if done % (10 * c.log_every) == 0 or done == c.steps:
        line += f"  held-out acc {_accuracy(model, *held):.4f}"
        model.train()
    log.info(line)


def _provenance(c: PretrainConfig, out: Path, measured: dict[str, Any], command: str | None) -> dict[str, Any]:
    """Describe what made the checkpoint: the command, settings, measurements, file and software."""
    return {
        "command": command if command is not None else shlex.join([sys.executable, *sys.argv]),
        "model": "vit_testbed_patch8_32",
        **{k: v for k, v in asdict(c).items() if k not in ("log_every", "threads")},
        "optimizer": "AdamW, warm-up + cosine, grad clip 1.0, random horizontal flip",
        "train_instance_seed": TRAIN_INSTANCES + c.seed,
        "heldout_instance_seed": HELDOUT_INSTANCES + c.seed,
        **measured,
        "threads": c.threads,
        "file": out.name,
        "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
        "size_bytes": out.stat().st_size,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


@torch.no_grad()
def _accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 512) -> float:
    """Return the top-1 accuracy of ``model`` on normalised ``images``."""
    model.eval()
    correct = sum(
        (model(images[i : i + batch_size]).argmax(-1) == labels[i : i + batch_size]).sum().item()
        for i in range(0, len(labels), batch_size)
    )
    return correct / max(len(labels), 1)
