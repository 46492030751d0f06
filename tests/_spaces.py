"""Tiny space files for tests: the testbed ViT, untrained (no weights to read), a few steps on digits."""

from __future__ import annotations

from typing import Any

import yaml

# A tiny search: the testbed ViT, untrained (no weights to read), a few steps on digits.
TINY_SPACE: dict[str, Any] = {
    "description": "tiny test search",
    "metric": "val_acc",
    "mode": "max",
    "algorithm": "grid",
    "num_samples": 1,
    "scheduler": "fifo",
    "parameters": {"components": {"choice": ["mha"]}, "lr": {"choice": [0.05]}, "optimizer": "sgd"},
    "defaults": {
        "model": "vit_testbed_patch8_32",
        "pretrained": False,
        "max_steps": 16,
        "eval_every": 8,
        "warmup_steps": 4,
        "batch_size": 32,
    },
}


def space_text(parameters: dict[str, Any] | None = None, defaults: dict[str, Any] | None = None, **top: Any) -> str:
    """A tiny space file's YAML: ``TINY_SPACE`` with ``parameters`` and ``defaults`` updated, other keys replaced."""
    space = {**TINY_SPACE, **top}
    space["parameters"] = {**TINY_SPACE["parameters"], **(parameters or {})}
    space["defaults"] = {**TINY_SPACE["defaults"], **(defaults or {})}
    return yaml.safe_dump(space, sort_keys=False)
