"""Pretraining the offline testbed ViT on generated fractals (the shipped ``.fractal`` checkpoint).

``pretrain_testbed`` trains ``vit_testbed_patch8_32`` from scratch to classify the 64 IFS classes
of ``vitplast_tune.data.fractals`` (AdamW, warm-up + cosine, label smoothing), checks it on held-out
variations of the same classes, and writes the safetensors file with a provenance JSON beside it.
The classes are those of ``fractal_dataset(seed=0)``, so the ``fractals`` dataset (instance seed 0,
never trained on) is a held-out sample of the pretraining distribution.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from vitplast_tune.data.fractals import fractal_dataset
from vitplast_tune.data.transforms import prepare_images
from vitplast_tune.vit.models import TESTBED_WEIGHTS, data_config
from vitplast_tune.vit.training import warmup_cosine

TRAIN_INSTANCES = 1000  # instance_seed offsets: train variations, held-out variations
HELDOUT_INSTANCES = 2000


def pretrain_testbed(
    out: str | Path = TESTBED_WEIGHTS,
    *,
    seed: int = 0,
    steps: int = 5000,
    batch_size: int = 128,
    lr: float = 2e-3,
    weight_decay: float = 0.05,
    warmup_steps: int = 200,
    label_smoothing: float = 0.1,
    num_classes: int = 64,
    images_per_class: int = 1500,
    heldout_per_class: int = 50,
    data_seed: int = 0,
    threads: int = 2,
    log_every: int = 100,
    command: str | None = None,
) -> dict[str, Any]:
    """Train the testbed ViT on fractals, write ``out`` (+ ``.json`` provenance), return the provenance."""
    start = time.time()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    out = Path(out).expanduser()

    model = timm.create_model("vit_testbed_patch8_32", pretrained=False, num_classes=num_classes)
    config = data_config(model)
    size = config["input_size"][-1]
    make = lambda per_class, offset: fractal_dataset(
        num_classes, per_class, size, data_seed, instance_seed=offset + seed
    )
    train_x, train_y = make(images_per_class, TRAIN_INSTANCES)
    train_x = prepare_images(train_x, config)
    held_x, held_y = make(heldout_per_class, HELDOUT_INSTANCES)
    held_x = prepare_images(held_x, config)
    print(f"data: {len(train_y)} train / {len(held_y)} held-out fractals in {time.time() - start:.1f}s", flush=True)

    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "pos_embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "pos_embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.999),
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, steps, warmup_steps))
    generator = torch.Generator().manual_seed(seed)
    per_epoch = len(train_y) // batch_size
    order = torch.randperm(len(train_y), generator=generator)

    model.train()
    running = 0.0
    for step in range(steps):
        b = step % per_epoch
        if b == 0 and step > 0:
            order = torch.randperm(len(train_y), generator=generator)
        idx = order[b * batch_size : (b + 1) * batch_size]
        images = train_x[idx]
        flip = torch.rand(len(idx), generator=generator) < 0.5
        images = torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)
        loss = F.cross_entropy(model(images), train_y[idx], label_smoothing=label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        running = loss.item() if step == 0 else 0.98 * running + 0.02 * loss.item()
        if not math.isfinite(running):
            raise RuntimeError(f"pretraining diverged at step {step}: loss {loss.item()}")
        if (step + 1) % log_every == 0 or step + 1 == steps:
            lr = schedule.get_last_lr()[0]
            line = f"step {step + 1}/{steps}  loss {running:.4f}  lr {lr:.2e}  {time.time() - start:.0f}s"
            if (step + 1) % (10 * log_every) == 0 or step + 1 == steps:
                line += f"  held-out acc {accuracy(model, held_x, held_y):.4f}"
                model.train()
            print(line, flush=True)

    held_acc = accuracy(model, held_x, held_y)
    train_acc = accuracy(model, train_x[: len(held_y) * 2], train_y[: len(held_y) * 2])
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().float() for k, v in model.state_dict().items()}
    save_file(state, str(out), metadata={"format": "pt"})
    provenance = {
        "command": command if command is not None else shlex.join([sys.executable, *sys.argv]),
        "model": "vit_testbed_patch8_32",
        "num_classes": num_classes,
        "seed": seed,
        "data_seed": data_seed,
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "weight_decay": weight_decay,
        "warmup_steps": warmup_steps,
        "label_smoothing": label_smoothing,
        "optimizer": "AdamW, warm-up + cosine, grad clip 1.0, random horizontal flip",
        "train_images": len(train_y),
        "heldout_images": len(held_y),
        "train_instance_seed": TRAIN_INSTANCES + seed,
        "heldout_instance_seed": HELDOUT_INSTANCES + seed,
        "heldout_accuracy": round(held_acc, 6),
        "train_accuracy_sample": round(train_acc, 6),
        "final_loss": round(running, 6),
        "wall_time_s": round(time.time() - start, 1),
        "threads": threads,
        "file": out.name,
        "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
        "size_bytes": out.stat().st_size,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    out.with_suffix(".json").write_text(json.dumps(provenance, indent=2) + "\n")
    print(f"held-out accuracy {held_acc:.4f}; wrote {out} ({provenance['size_bytes'] / 1e6:.2f} MB)", flush=True)
    return provenance


@torch.no_grad()
def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` on normalised ``images``."""
    model.eval()
    correct = sum(
        (model(images[i : i + batch_size]).argmax(-1) == labels[i : i + batch_size]).sum().item()
        for i in range(0, len(labels), batch_size)
    )
    return correct / max(len(labels), 1)
