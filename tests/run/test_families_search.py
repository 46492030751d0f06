"""``vitplast-search --model <a tiny model of the family> --set pretrained=false --max-steps 20`` end to end, offline,
for every family in the registry: one trial of a subset trained by LoRA, BitFit and in full, its records, and the
best model back; for two families the search's plasticity too, on 16 pairs (the unit tests measure every family's,
and each measurement costs a search a Ray worker of its own)."""

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


MEASURED = {"timm-eva", "hf-vit"}


def test_every_registered_family_has_a_search_here():
    assert set(PER_FAMILY) == {f.name for f in registry.families()}


@pytest.mark.parametrize("family", sorted(PER_FAMILY))
def test_a_search_runs_end_to_end_on_a_tiny_model_of_the_family(family, ray_local, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    model = model_name(PER_FAMILY[family], tmp_path / "hf")
    storage = tmp_path / "results"
    argv = ["--space", str(space), "--model", model, "--set", "pretrained=false", "--max-steps", "20"]
    argv += ["--plasticity-pairs", "16"] if family in MEASURED else ["--no-plasticity"]
    argv += ["--storage", str(storage), "--name", "family", "--quiet"]
    assert cli.search.search_main(argv) == 0
    trials = pd.read_csv(storage / "family" / "trials.csv")
    (trial,) = trials.itertuples()
    assert trial.step == 20 and pd.isna(trial.error) and 0 <= trial.test_acc <= 1
    if family in MEASURED:  # measured on the family's components
        assert math.isfinite(trial.plasticity_mean) and trial.plasticity_mean > 0
    loaded = best_model.load_best_model("family", storage)
    assert registry.family_of(loaded).name == family
    with torch.no_grad():
        assert loaded(torch.randn(2, 3, 32, 32)).shape == (2, 10)  # digits' 10 classes
