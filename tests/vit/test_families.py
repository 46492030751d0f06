"""Every model family on a tiny random model: the components' parameter counts add up to the model's, freezing trains
exactly the subset, the family's embedding and blocks reproduce the model, plasticity (both variants) runs and its
paper variant equals a hand computation on block 0, LoRA acts on every layer the layout names and merges back, BitFit
trains the biases; and per family a two-step trial whose best model reloads with the same predictions."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _families import FAMILY_OF, HF, PER_FAMILY, TIMM, build, model_name

from vitplast_tune import components, freezing
from vitplast_tune.config import FinetuneConfig, PlasticityInputs
from vitplast_tune.errors import UserError
from vitplast_tune.vit import methods, models, training
from vitplast_tune.vit.families import registry
from vitplast_tune.vit.families.base import first_tensor
from vitplast_tune.vit.plasticity import compute_plasticity

KINDS = [*TIMM, *HF]

# Parameters whose component each family's layout must say, written out by hand.
PLACED = {
    "deit-distilled": {"dist_token": "emb", "head_dist.weight": "head", "blocks.1.attn.qkv.weight": "mha"},
    "vit-swiglu-regs": {
        "reg_token": "emb",
        "blocks.0.mlp.fc1_g.weight": "fc1",
        "blocks.0.mlp.fc1_x.bias": "fc1",
        "blocks.0.ls1.gamma": "mha",
        "blocks.0.ls2.gamma": "fc2",
    },
    "vit-hybrid": {"patch_embed.backbone.stem.conv.weight": "emb", "patch_embed.proj.weight": "emb"},
    "eva02-fused": {"blocks.0.attn.q_bias": "mha", "blocks.0.attn.qkv.weight": "mha", "blocks.0.mlp.fc1.weight": "fc1"},
    "eva02": {
        "blocks.0.attn.q_proj.weight": "mha",
        "blocks.0.attn.k_proj.weight": "mha",
        "blocks.0.mlp.fc1_g.weight": "fc1",
        "blocks.0.mlp.norm.weight": "fc2",
        "blocks.1.mlp.fc2.bias": "fc2",
        "pos_embed": "emb",
    },
    "dinov3": {"reg_token": "emb", "blocks.0.gamma_1": "mha", "blocks.0.gamma_2": "fc2"},
    "rope-mixed": {"blocks.0.gamma_1": "mha", "cls_token": "emb"},
    "beit": {
        "blocks.0.attn.relative_position_bias_table": "mha",
        "blocks.0.attn.q_bias": "mha",
        "blocks.0.gamma_1": "mha",
        "blocks.0.gamma_2": "fc2",
        "fc_norm.weight": "head",
    },
    "beit-shared": {"rel_pos_bias.relative_position_bias_table": "emb"},
    "relpos": {"blocks.0.attn.rel_pos.mlp.fc1.weight": "mha", "blocks.0.ls1.gamma": "mha"},
    "relpos-rpn": {"blocks.1.norm1.weight": "ln1", "norm.weight": "head"},
    "naflex": {"embeds.proj.weight": "emb", "embeds.reg_token": "emb", "blocks.0.ls2.gamma": "fc2"},
    "hf-vit": {
        "model.vit.embeddings.cls_token": "emb",
        "model.vit.layers.0.attention.q_proj.weight": "mha",
        "model.vit.layers.1.layernorm_after.bias": "ln2",
        "model.vit.layernorm.weight": "head",
        "model.classifier.weight": "head",
    },
    "hf-deit": {"model.deit.embeddings.distillation_token": "emb", "model.deit.layers.0.mlp.fc1.weight": "fc1"},
    "hf-dinov2": {
        "model.dinov2.embeddings.mask_token": "emb",
        "model.dinov2.encoder.layer.0.layer_scale1.lambda1": "mha",
        "model.dinov2.encoder.layer.0.layer_scale2.lambda1": "fc2",
    },
    "hf-dinov2-swiglu": {
        "model.dinov2.encoder.layer.0.mlp.gate_proj.weight": "fc1",
        "model.dinov2.encoder.layer.0.mlp.up_proj.weight": "fc1",
        "model.dinov2.encoder.layer.0.mlp.down_proj.weight": "fc2",
    },
    "hf-dinov2-registers": {"model.dinov2_with_registers.embeddings.register_tokens": "emb"},
}
# How many layer-scale tensors each model has (one per block for mha and for fc2), found by the layout's names.
LAYER_SCALES = {
    "vit-swiglu-regs": 4,
    "dinov3": 4,
    "rope-mixed": 4,
    "beit": 4,
    "beit-shared": 4,
    "relpos": 4,
    "naflex": 4,
}
LAYER_SCALES.update({k: 4 for k in ("hf-dinov2", "hf-dinov2-swiglu", "hf-dinov2-registers")})


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Where the tiny transformers configs are written."""
    return tmp_path_factory.mktemp("hf")


def trainable_names(model) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def pixels(n: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("kind", KINDS)
def test_the_family_is_found_and_the_component_counts_add_up(kind, root):
    model = build(kind, root)
    family = registry.family_of(model)
    assert family.name == FAMILY_OF[kind]
    counts = freezing.count_parameters(model, layout=family.layout)
    assert sum(counts.values()) == sum(p.numel() for p in model.parameters())
    assert all(counts[c] > 0 for c in (*components.COMPONENTS, "head")), counts
    for name, component in PLACED.get(kind, {}).items():
        assert freezing.parameter_component(name, family.layout)[0] == component, name
    scales = [
        n
        for n, _ in model.named_parameters()
        for c, names in family.layout.layer_scales.items()
        if (m := _block_rest(n, family.layout)) and freezing._under(m, names)
    ]
    assert len(scales) == LAYER_SCALES.get(kind, 0), scales


def _block_rest(name: str, layout) -> str | None:
    prefix = layout.blocks + "."
    return name[len(prefix) :].split(".", 1)[1] if name.startswith(prefix) else None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("subset", ["mha", "ln1+fc2", "emb+ln2", "fc1", "head"])
def test_freezing_trains_exactly_the_subset_and_only_it_gets_gradients(kind, subset, root):
    model = build(kind, root).train()
    layout = registry.layout_of(model)
    counts = freezing.freeze(model, subset, layout=layout)
    chosen = set(components.parse_subset(subset)) | {"head"}
    expected = {n for n, _ in model.named_parameters() if freezing.parameter_component(n, layout)[0] in chosen}
    assert trainable_names(model) == expected
    assert sum(counts.values()) == sum(p.numel() for p in model.parameters() if p.requires_grad)
    model(pixels(2, 0)).square().mean().backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad <= expected and with_grad, (kind, subset)


@pytest.mark.parametrize("kind", KINDS)
def test_the_embedding_is_the_real_input_of_block_0_and_the_blocks_and_head_reproduce_the_model(kind, root):
    model = build(kind, root)
    family = registry.family_of(model)
    x = pixels(3, 1)
    seen = _block_0_input(model, family, x)
    with torch.no_grad():
        embedded = family.embed(model, x)
        assert torch.equal(embedded.tokens, seen[0])
        if family.cache_features:  # timm: the tokens of forward_features, and the logits
            features = family.features(model, x)
            torch.testing.assert_close(model.norm(features), model.forward_features(x), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(family.head(model, features), model(x), rtol=1e-5, atol=1e-9)


def _block_0_input(model, family, x) -> tuple:
    """(tokens, keyword arguments) that block 0 receives in the model's own forward pass."""
    seen = []
    block = family.blocks(model)[0]
    handle = block.register_forward_pre_hook(lambda m, args, kwargs: seen.append((args[0], kwargs)), with_kwargs=True)
    with torch.no_grad():
        model(x)
    handle.remove()
    return seen[0]


# Block 0's components by hand, per family: (ln1, mha, ln2, fc1 as a list of modules joined, fc2), and the
# keyword arguments its attention takes from its block's.
HAND = {
    "timm-vit": ("norm1", "attn", "norm2", ("mlp.fc1", "mlp.fc1_g", "mlp.fc1_x"), ("mlp.fc2",), ()),
    "timm-eva": ("norm1", "attn", "norm2", ("mlp.fc1", "mlp.fc1_g", "mlp.fc1_x"), ("mlp.fc2",), ("rope",)),
    "timm-beit": ("norm1", "attn", "norm2", ("mlp.fc1",), ("mlp.fc2",), ("shared_rel_pos_bias",)),
    "timm-relpos": ("norm1", "attn", "norm2", ("mlp.fc1",), ("mlp.fc2",), ("shared_rel_pos",)),
    "timm-naflex": ("norm1", "attn", "norm2", ("mlp.fc1",), ("mlp.fc2",), ("attn_mask", "rope")),
    "hf-vit": ("layernorm_before", "attention", "layernorm_after", ("mlp.fc1",), ("mlp.fc2",), ()),
    "hf-deit": ("layernorm_before", "attention", "layernorm_after", ("mlp.fc1",), ("mlp.fc2",), ()),
    "hf-dinov2": (
        "norm1",
        "attention",
        "norm2",
        ("mlp.fc1", "mlp.gate_proj", "mlp.up_proj"),
        ("mlp.fc2", "mlp.down_proj"),
        (),
    ),
}
HAND["hf-dinov2-registers"] = HAND["hf-dinov2"]


def _get(block, name):
    try:
        return block.get_submodule(name)
    except AttributeError:
        return None


@pytest.mark.parametrize("kind", KINDS)
def test_paper_plasticity_equals_a_hand_computation_on_block_0_and_in_network_runs(kind, root):
    model = build(kind, root).double()
    family = registry.family_of(model)
    ref, down = pixels(5, 2, torch.float64), pixels(5, 3, torch.float64) * 0.5 + 0.1
    table = compute_plasticity(model, ref, down, batch_size=2, device="cpu")
    ln1, mha, ln2, fc1s, fc2s, attn_keys = HAND[family.name]
    block = family.blocks(model)[0]
    fc2 = next(m for n in fc2s if (m := _get(block, n)) is not None)

    @torch.no_grad()
    def outputs(x):
        e, kwargs = _block_0_input(model, family, x)
        attn_kwargs = {k: v for k, v in kwargs.items() if k in attn_keys}
        padded = F.pad(e, (0, fc2.in_features - e.shape[-1]))
        fc1 = torch.cat([m(e) for n in fc1s if (m := _get(block, n)) is not None], dim=-1)
        return e, {
            "ln1": block.get_submodule(ln1)(e),
            "mha": first_tensor(block.get_submodule(mha)(e, **attn_kwargs)),
            "ln2": block.get_submodule(ln2)(e),
            "fc1": fc1,
            "fc2": fc2(padded),
        }

    ratios: dict[str, list[float]] = {}
    for i in range(5):
        ex, out_x = outputs(ref[i : i + 1])
        ey, out_y = outputs(down[i : i + 1])
        for c in out_x:
            ratios.setdefault(c, []).append(float((out_x[c] - out_y[c]).norm() / (ex - ey).norm()))
    measured = table[table["layer"] == 0].set_index("component")["plasticity"]
    for c, values in ratios.items():
        np.testing.assert_allclose(measured[c], np.mean(values), rtol=1e-8, err_msg=c)
    in_network = compute_plasticity(model, ref, down, variant="in_network", device="cpu")
    assert len(in_network) == len(table) == 1 + 5 * len(family.blocks(model))
    assert (in_network["plasticity"] > 0).all() and np.isfinite(in_network["plasticity"]).all()


def lora_cfg(subset: str = "mha:lora+fc1:lora+fc2:lora") -> FinetuneConfig:
    return FinetuneConfig(components=subset, lora_rank=2, lora_alpha=4.0)


@pytest.mark.parametrize("kind", KINDS)
def test_lora_acts_on_every_layer_the_layout_names_and_merges_back_into_the_plain_model(kind, root):
    model = build(kind, root)
    family = registry.family_of(model)
    layout, depth = family.layout, len(family.blocks(model))
    x = pixels(2, 4)
    counts = methods.apply_methods(model, lora_cfg())
    adapted = {n.rsplit(".lora_B", 1)[0] for n, _ in model.named_parameters() if ".lora_B." in n}
    layers = {n for c in ("mha", "fc1", "fc2") for b in range(depth) for n in freezing.lora_layers(model, c, b, layout)}
    assert adapted == layers and len(layers) >= 3 * depth
    head = {n for n, _ in model.named_parameters() if freezing.parameter_component(n, layout)[0] == "head"}
    assert trainable_names(model) == {n for n, _ in model.named_parameters() if freezing.is_adapter(n)} | head
    assert counts["mha"] > 0 and counts["ln1"] == 0
    with torch.no_grad():
        before = family.features(model, x)
        for name in sorted(adapted):  # each adapter alone changes the tokens: no layer is bypassed
            model.get_submodule(name).lora_B["default"].weight.normal_(0, 0.5)
            after = family.features(model, x)
            assert not torch.allclose(after, before, rtol=0, atol=1e-5), f"LoRA on {name} does not act"
            before = after
        adapter_out = model(x)
        merged = methods.merge_lora(copy.deepcopy(model))
        assert not any(freezing.is_adapter(n) for n, _ in merged.named_parameters())
        torch.testing.assert_close(merged(x), adapter_out, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_bitfit_trains_every_bias_and_nothing_else(kind, root):
    model = build(kind, root)
    layout = registry.layout_of(model)
    methods.apply_methods(model, FinetuneConfig(components="all:bitfit"))
    head = {n for n, _ in model.named_parameters() if freezing.parameter_component(n, layout)[0] == "head"}
    biases = {n for n, _ in model.named_parameters() if freezing.is_bias(n)}
    assert trainable_names(model) == (biases - head) | head
    if kind in ("beit", "eva02-fused"):  # separate q / v biases are biases too
        assert "blocks.0.attn.q_bias" in trainable_names(model)


def test_a_model_of_no_family_is_one_line_naming_the_families():
    with pytest.raises(
        UserError, match=r'"convnext_atto" is a ConvNeXt, of no supported model family; supported: timm-vit'
    ):
        models.create_model("convnext_atto", 3, pretrained=False)
    with pytest.raises(UserError, match="no config.json"):
        models.create_model("hf:/nonexistent/folder", 3, pretrained=False)
    with pytest.raises(UserError, match="has no pretrained weights; train it from scratch with pretrained=false"):
        models.check_weights("eva02_testbed_patch8_32", None, True)


TRIAL = dict(max_steps=2, eval_every=2, warmup_steps=1, batch_size=8, threads=1, lr=0.05, pretrained=False, seed=3)


@pytest.mark.parametrize("family", sorted(PER_FAMILY))
@pytest.mark.parametrize("subset", ["ln1+mha+fc2", "mha:lora+fc1:bitfit"])
def test_a_two_step_trial_trains_the_subset_and_its_best_model_reloads_with_the_same_predictions(family, subset, root):
    cfg = FinetuneConfig(model=model_name(PER_FAMILY[family], root), components=subset, **TRIAL)
    states = []
    model, metrics = training.finetune(cfg, report=lambda m, state: states.append(copy.deepcopy(state)))
    assert metrics["step"] == 2 and 0 <= metrics["test_acc"] <= 1
    trained = states[-1]["best"]["trainable"]
    layout = registry.layout_of(model)
    placed = {freezing.parameter_component(n, layout)[0] for n in trained}
    assert placed == set(components.parse_subset(subset)) | {"head"}
    start = training.create_run_model(cfg)
    moved = [n for n, p in start.named_parameters() if n in trained and not torch.equal(p, trained[n])]
    assert moved, "two steps changed none of the trained tensors"
    rebuilt = methods.plain_model(cfg, trained)
    x = pixels(4, 5)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), model.cpu()(x), rtol=1e-5, atol=1e-6)


def test_the_plasticity_cache_key_changes_with_a_local_transformers_folders_files(root, tmp_path):
    from _families import hf_folder

    from vitplast_tune.predictors import cache

    name = hf_folder(tmp_path, "hf-vit")
    args = dict(weights=None, pretrained=False, dataset="digits", reference="fractals", reference_split="test")
    key = lambda: cache.cache_key(PlasticityInputs(name, **args, data_dir=None, variant="paper", max_pairs=None))
    before = key()
    assert before == key() and "config.json" in before["weights"]
    (tmp_path / "hf-vit" / "model.safetensors").write_bytes(b"new weights")
    assert key()["weights"] != before["weights"]


def test_a_family_of_ones_own_is_registered_before_the_shipped_ones(monkeypatch):
    from timm.models.vision_transformer import VisionTransformer

    from vitplast_tune.vit.families.timm_vit import TimmViT

    class Mine(VisionTransformer):
        pass

    class MyFamily(TimmViT):
        name, about = "mine", "a VisionTransformer of my own"
        model_classes = (Mine,)

    monkeypatch.setattr(registry, "_FAMILIES", registry.families())  # the shipped list, untouched after the test
    registry.register(MyFamily())
    model = Mine(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=2)
    assert registry.family_of(model).name == "mine" and registry.get_family("mine").name == "mine"
    assert registry.family_of(build("vit", None)).name == "timm-vit"  # its class is not Mine: the shipped family
    with pytest.raises(ValueError, match="registered already"):
        registry.register(MyFamily())
    with pytest.raises(UserError, match='unknown model family "yours"'):
        registry.get_family("yours")
