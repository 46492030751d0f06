"""The shipped testbed checkpoint: loads through timm by its tag, new head, provenance, size, quality."""

import json

import pytest
import torch
from safetensors.torch import load_file

from vitplast_tune.data.fractals import fractal_dataset
from vitplast_tune.data.transforms import prepare_images
from vitplast_tune.vit.models import TESTBED_MODEL, TESTBED_WEIGHTS, create_model, data_config

PROVENANCE = TESTBED_WEIGHTS.with_suffix(".json")


def test_checkpoint_is_small_and_has_provenance():
    assert TESTBED_WEIGHTS.is_file()
    assert TESTBED_WEIGHTS.stat().st_size < 3_000_000
    info = json.loads(PROVENANCE.read_text())
    assert info["heldout_accuracy"] >= 0.99
    assert info["size_bytes"] == TESTBED_WEIGHTS.stat().st_size
    assert info["command"].startswith("python scripts/pretrain.py")
    for key in ("seed", "steps", "batch_size", "lr", "wall_time_s", "torch", "timm", "date"):
        assert key in info


def test_loads_backbone_with_new_head():
    torch.manual_seed(0)
    model = create_model(TESTBED_MODEL, num_classes=10)
    saved = load_file(str(TESTBED_WEIGHTS))
    state = model.state_dict()
    backbone = [k for k in saved if not k.startswith("head.")]
    assert len(backbone) > 40 and set(backbone) | {"head.weight", "head.bias"} == set(state)
    for key in backbone:
        assert torch.equal(state[key], saved[key]), key
    assert saved["head.weight"].shape == (64, 96)
    assert state["head.weight"].shape == (10, 96) and state["head.bias"].shape == (10,)
    assert not torch.equal(state["head.weight"], saved["head.weight"][:10])
    assert data_config(model)["input_size"] == (3, 32, 32)


@pytest.mark.timeout(60)
def test_pretrained_head_recognises_unseen_fractals():
    # instance seed 0 (the 'fractals' dataset) was never trained on
    model = create_model(TESTBED_MODEL, num_classes=64).eval()
    images, labels = fractal_dataset(images_per_class=5)
    with torch.no_grad():
        predicted = model(prepare_images(images, data_config(model))).argmax(dim=1)
    assert (predicted == labels).float().mean() >= 0.95
