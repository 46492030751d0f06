"""A run's model back: ``finetune`` returns it with its best-validation weights, and ``plain_model`` makes the same model
from the run's settings and the trained tensors alone (what a search keeps of its best trial)."""

import copy

import pytest
import torch

from vitplast_tune.errors import UserError
from vitplast_tune.vit import best_model, methods, training
from vitplast_tune.vit.training import FinetuneConfig, finetune

CFG = FinetuneConfig(
    model="vit_testbed_patch8_32",
    pretrained=False,  # the untrained parts come from the seed: plain_model must seed them the same way
    components="fc1",
    lr=0.3,
    max_steps=12,
    eval_every=4,
    warmup_steps=3,
    batch_size=32,
    threads=1,
    seed=7,
)


def test_finetune_returns_the_model_with_its_best_validation_weights_and_plain_model_gives_it_back():
    reports = []
    model, metrics = finetune(CFG, report=lambda m, state: reports.append((m, copy.deepcopy(state))))
    assert not model.training and metrics["step"] == 12
    _, splits = training.build_run(CFG)
    test = training.evaluate(model, splits.test, batch_size=CFG.batch_size, device=torch.device("cpu"))["acc"]
    assert test == metrics["test_acc"]  # the model returned is the one tested: its best-validation weights
    best = reports[-1][1]["best"]
    assert best["val_acc"] == metrics["best_val_acc"]
    rebuilt = methods.plain_model(CFG, best["trainable"])
    assert not rebuilt.training
    images = torch.stack([splits.test[i][0] for i in range(8)])
    with torch.no_grad():
        assert torch.equal(rebuilt(images), model(images))
    assert (
        training.evaluate(rebuilt, splits.test, batch_size=CFG.batch_size, device=torch.device("cpu"))["acc"]
        == metrics["test_acc"]
    )


def test_plain_model_refuses_tensors_of_another_model():
    with pytest.raises(UserError, match="do not fit vit_testbed_patch8_32"):
        methods.plain_model(CFG, {"blocks.0.mlp.fc1.weight": torch.zeros(3, 3)})
    with pytest.raises(UserError, match="unknown names or other shapes"):
        methods.plain_model(CFG, {"encoder.layer.0.weight": torch.zeros(3)})


def test_a_best_model_its_node_cannot_build_is_a_note_and_its_weights_are_still_written(tmp_path):
    """E.g. a node without the weights file the search names: ``prepare`` (in the best model's worker) says why in
    its note, writes the best weights all the same and no MLflow model; the search's results stand."""
    from ray.tune import Checkpoint
    from safetensors.torch import load_file, save_file

    from vitplast_tune.storage import BEST_FILE, MODEL_NAME, WEIGHTS_FILE

    trained = {"head.weight": torch.zeros(5, 32), "head.bias": torch.ones(5)}
    (tmp_path / "checkpoint").mkdir()
    save_file(trained, str(tmp_path / "checkpoint" / BEST_FILE))
    cfg = FinetuneConfig(model="vit_testbed_patch8_32", weights=str(tmp_path / "elsewhere.safetensors"))
    target = tmp_path / "staged"
    note = best_model.prepare(cfg, Checkpoint.from_directory(str(tmp_path / "checkpoint")), str(target))
    assert note.startswith("the best model is not logged as an MLflow model: it could not be built on its node")
    assert "elsewhere.safetensors" in note
    assert not (target / MODEL_NAME).exists()
    assert torch.equal(load_file(str(target / WEIGHTS_FILE))["head.bias"], torch.ones(5))
