"""``vitplast-search --model <a tiny model> --set pretrained=false --max-steps 20`` end to end, offline, on a
transformers ViT (the family furthest from timm's): one trial of a subset trained by LoRA, BitFit and in full, its
plasticity measured on 16 pairs, its records, and the best model back.

Every registered family is trained, measured and reloaded at unit level (tests/vit/test_families.py: a two-step
trial of each family by LoRA, BitFit and in full, its best model back with the same predictions; its plasticity by
hand); a search runs the same code whatever the family, so one family end to end is enough here."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from _families import PER_FAMILY, model_name

from vitplast_tune import cli
from vitplast_tune.vit import best_model
from vitplast_tune.vit.families import registry

pytestmark = pytest.mark.slow

SPACE = """\
description: one trial of a family's tiny model
metric: val_acc
mode: max
algorithm: grid
num_samples: 1
scheduler: fifo
parameters:
  components: {choice: ["mha:lora+fc1+ln2:bitfit"]}
  lr: 0.05
defaults: {eval_every: 10, warmup_steps: 2, batch_size: 16}
"""


FAMILY = "hf-vit"


def test_every_registered_family_is_trained_at_unit_level():
    assert set(PER_FAMILY) == {f.name for f in registry.families()}


def test_a_search_runs_end_to_end_on_a_tiny_transformers_vit(ray_local, tmp_path):
    family = FAMILY
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    model = model_name(PER_FAMILY[family], tmp_path / "hf")
    storage = tmp_path / "results"
    argv = ["--space", str(space), "--model", model, "--set", "pretrained=false", "--max-steps", "20"]
    argv += ["--plasticity-pairs", "16"]
    argv += ["--storage", str(storage), "--name", "family", "--quiet"]
    assert cli.search.search_main(argv) == 0
    trials = pd.read_csv(storage / "family" / "trials.csv")
    (trial,) = trials.itertuples()
    assert trial.step == 20 and pd.isna(trial.error) and 0 <= trial.test_acc <= 1
    assert math.isfinite(trial.plasticity_mean) and trial.plasticity_mean > 0  # measured on the family's components
    loaded = best_model.load_best_model("family", storage)
    assert registry.family_of(loaded).name == family
    with torch.no_grad():
        assert loaded(torch.randn(2, 3, 32, 32)).shape == (2, 10)  # digits' 10 classes
