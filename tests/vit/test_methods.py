"""Finetuning methods per component on the testbed: LoRA (peft) and BitFit trials trained for real, their trainable
counts against hand counts from the layer shapes, frozen weights unmoved, and LoRA merged back into a plain timm
model with the same predictions."""

import copy

import pytest
import timm
import torch

from vitplast_tune import components, freezing
from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data import datasets
from vitplast_tune.data.batches import eval_batches
from vitplast_tune.errors import UserError
from vitplast_tune.vit import methods, models, training
from vitplast_tune.vit.families.registry import layout_of

# The testbed ViT: 4 blocks of width 96, MLP width 384 (4 x 96), qkv 96 -> 288; digits has 10 classes.
WIDTH, HIDDEN, BLOCKS, CLASSES = 96, 384, 4, 10
HEAD = (WIDTH * CLASSES + CLASSES) + 2 * WIDTH  # head Linear + the final norm's weight and bias (always trained)
TESTBED = dict(max_steps=12, eval_every=6, warmup_steps=2, batch_size=32, threads=1, lr=0.3)


def train(monkeypatch, **overrides):
    """Finetune the pretrained testbed; return its config, final metrics, the trained model itself and the last
    state it reported (trainable tensors; ``best``: the best-validation ones, which the model holds at the end)."""
    states = []
    cfg = FinetuneConfig(**{**TESTBED, **overrides})
    model, final = training.finetune(cfg, report=lambda metrics, state: states.append(copy.deepcopy(state)))
    return cfg, final, model, states[-1]


def pretrained(seed=0):
    torch.manual_seed(seed)  # the new head's initialisation, as build_run does
    return models.create_model("vit_testbed_patch8_32.fractal", CLASSES)


def digit_images(model, n=64):
    splits = datasets.load_dataset("digits", models.data_config(model), seed=0)
    return next(iter(eval_batches(splits.test, n)))[0]


def unmoved_except(model, trains) -> list[str]:
    """The parameters of ``model`` that differ from the pretrained model's, LoRA adapters left out (the base layers
    they wrap compared by their plain names)."""
    reference = dict(pretrained().named_parameters())
    moved = []
    for name, p in model.named_parameters():
        if freezing.is_adapter(name):
            continue
        if not torch.equal(p.detach(), reference[name.replace(".base_layer", "")]):
            moved.append(name)
    return sorted(moved)


def test_a_lora_trial_trains_its_adapters_only_and_merges_into_a_plain_timm_model(monkeypatch):
    cfg, final, model, state = train(monkeypatch, components="mha:lora+fc1:lora", depth="last", lora_rank=4)
    r, last = 4, BLOCKS - 1
    # By hand, from the layer shapes: LoRA adds r x (in + out) per adapted Linear, here in the last block only.
    mha = r * ((WIDTH + 3 * WIDTH) + (WIDTH + WIDTH))  # attn.qkv 96 -> 288, attn.proj 96 -> 96
    fc1 = r * (WIDTH + HIDDEN)  # mlp.fc1 96 -> 384
    assert final["trainable_params"] == mha + fc1 + HEAD == 2304 + 1920 + 1162
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(state["trainable"])
    adapters = {n for n in trainable if freezing.is_adapter(n)}
    assert adapters == {
        f"blocks.{last}.{layer}.lora_{ab}.default.weight"
        for layer in ("attn.qkv", "attn.proj", "mlp.fc1")
        for ab in "AB"
    }
    assert trainable - adapters == {"head.weight", "head.bias", "norm.weight", "norm.bias"}
    assert all(state["trainable"][n].abs().sum() > 0 for n in adapters if ".lora_B." in n)  # B starts at 0: it trained
    # Frozen weights did not move (the base layers under the adapters included); the head did.
    assert unmoved_except(model, trainable) == ["head.bias", "head.weight", "norm.bias", "norm.weight"]

    images = digit_images(model)
    model.eval()
    with torch.no_grad():
        want = model(images)
    merged = methods.merge_lora(model)
    plain = timm.create_model("vit_testbed_patch8_32", pretrained=False, num_classes=CLASSES)
    plain.load_state_dict(merged.state_dict(), strict=True)  # a plain timm model: the same keys, nothing more
    plain.eval()
    with torch.no_grad():
        got = plain(images)
    assert (got - want).abs().max() < 1e-4 and torch.equal(got.argmax(-1), want.argmax(-1))
    # From the saved best weights alone, as a search's best trial: the same plain model.
    rebuilt = methods.plain_model(cfg, state["best"]["trainable"])
    assert list(rebuilt.state_dict()) == list(plain.state_dict())  # plain timm keys again
    with torch.no_grad():
        assert (rebuilt(images) - want).abs().max() < 1e-4


def test_a_bitfit_trial_trains_biases_only(monkeypatch):
    _, final, model, _ = train(monkeypatch, components="all:bitfit")
    # By hand: every bias of the six components, in every block, and the head.
    emb = WIDTH  # patch_embed.proj.bias (cls_token, pos_embed and the conv weight have no bias)
    per_block = {"ln1": WIDTH, "mha": 3 * WIDTH + WIDTH, "ln2": WIDTH, "fc1": HIDDEN, "fc2": WIDTH}
    assert final["trainable_params"] == emb + BLOCKS * sum(per_block.values()) + HEAD == 96 + 4 * 1056 + 1162
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(n.endswith(".bias") or n in ("head.weight", "norm.weight") for n in trainable)
    moved = unmoved_except(model, trainable)
    assert set(moved) <= trainable  # frozen weights did not move
    assert sum(n.endswith(".bias") and n.startswith("blocks.") for n in moved) == 4 * 6  # ln1, qkv, proj, ln2, fc1, fc2
    assert methods.merge_lora(model) is model  # nothing to merge: already a plain timm model


@pytest.mark.parametrize(
    "recipe, depth, rank",
    [
        ("mha:lora", "all", 8),
        ("fc2:lora+ln1:bitfit+emb", "middle", 4),
        ("all", "1-2", 8),
        ("fc1+mha:bitfit", "first", 2),
    ],
)
def test_counts_from_the_parameter_summary_match_a_real_run(recipe, depth, rank):
    torch.manual_seed(0)
    model = models.create_model("vit_testbed_patch8_32", CLASSES, pretrained=False)
    summary = freezing.parameter_summary(model, layout=layout_of(model))
    cfg = FinetuneConfig(model="vit_testbed_patch8_32", components=recipe, depth=depth, lora_rank=rank)
    counts = methods.apply_methods(model, cfg)
    assert counts == freezing.count_trainable(summary, recipe, cfg.block_indices(BLOCKS), rank)
    assert sum(counts.values()) == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_lora_goes_only_where_the_depth_says_and_only_on_linear_components(tiny_vit):
    assert methods.lora_targets(tiny_vit, "fc2:lora+mha", [1]) == ["blocks.1.mlp.fc2"]
    cfg = FinetuneConfig(components="mha:lora", blocks=[0], lora_rank=2)
    counts = methods.apply_methods(tiny_vit, cfg)
    assert counts["mha"] == 2 * ((32 + 96) + (32 + 32))
    assert not any(freezing.is_adapter(n) for n, _ in tiny_vit.blocks[1].named_parameters())
    with pytest.raises(UserError, match='cannot train by "lora"'):
        components.parse_methods("ln2:lora")
    with pytest.raises(UserError, match="no adapters there"):
        model = models.create_model("vit_testbed_patch8_32", 3, pretrained=False)
        freezing.freeze(model, "fc1:lora", layout=layout_of(model))
