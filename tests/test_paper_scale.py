"""The real search at the paper's scale: a randomly initialised ViT-B/16 at 224 px, through scripts/search.py.

One grid search, one trial per dataset family that is held differently: digits (in memory, 8x8), a
generated set in CIFAR-10-C's .npy format (in memory, 32x32) and a generated ImageFolder (read from
disk by DataLoader workers). Two steps of batch 4 each, so that it stays short on CI's two cores.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

SPACE = """\
description: Paper scale, two steps of a randomly initialised ViT-B/16 at 224 px on each kind of dataset.
metric: val_acc
mode: max
algorithm: grid
num_samples: 1
scheduler: fifo
parameters:
  components: {choice: [mha]}
  dataset: {choice: [digits, "cifar10c:snow", imagefolder]}
  lr: 0.01
defaults:
  model: vit_base_patch16_224
  pretrained: false
  dataset: digits
  max_steps: 2
  batch_size: 4
  warmup_steps: 1
  eval_every: 2
  val_fraction: 0.01
  eval_test: false
"""


def make_data(root: Path) -> None:
    """CIFAR-10-C's files (5 severities x 20 images) and an ImageFolder of 3 classes x 4 PNGs, in ``root``."""
    rng = np.random.default_rng(0)
    (root / "CIFAR-10-C").mkdir(parents=True)
    np.save(root / "CIFAR-10-C" / "snow.npy", rng.integers(0, 255, (100, 32, 32, 3), dtype=np.uint8))
    np.save(root / "CIFAR-10-C" / "labels.npy", np.tile(np.arange(10), 10).astype(np.uint8))
    for cls in ("cat", "dog", "eel"):
        (root / "train" / cls).mkdir(parents=True)
        for i in range(4):
            pixels = rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "train" / cls / f"{i}.png")


def test_vit_b16_at_224px_on_digits_cifar10c_and_an_imagefolder(tmp_path):
    make_data(tmp_path / "data")
    (tmp_path / "paper.yaml").write_text(SPACE)
    command = [
        sys.executable,
        str(ROOT / "scripts" / "search.py"),
        "--space",
        str(tmp_path / "paper.yaml"),
        "--storage",
        str(tmp_path / "results"),
        "--name",
        "paper",
        "--data-dir",
        str(tmp_path / "data"),
        "--no-plasticity",
        "--quiet",
        "--cpus-per-trial",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = pd.read_csv(tmp_path / "results" / "paper" / "trials.csv")
    assert len(trials) == 3 and (trials["step"] == 2).all() and not trials["diverged"].any()
    assert (trials["trainable_params"] > 28_000_000).all()  # ViT-B/16's attention, every block
    assert trials["trainable_params"].nunique() == 2  # heads of 10 classes (digits, CIFAR-10-C) and of 3 (the folder)
    assert "vit_base_patch16_224 on digits" in proc.stdout
