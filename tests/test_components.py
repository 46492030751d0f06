import pytest
import timm

from vitplast_tune import components
from vitplast_tune.errors import UserError


def trainable_names(model):
    return {n for n, p in model.named_parameters() if p.requires_grad}


def test_parse_subset_forms():
    assert components.parse_subset("fc1+mha") == ("mha", "fc1")
    assert components.parse_subset(["ln2", "emb"]) == ("emb", "ln2")
    assert components.parse_subset("all") == components.COMPONENTS
    assert components.parse_subset("head") == ()
    assert components.subset_name(["fc2", "mha"]) == "mha+fc2"
    assert components.subset_name(components.COMPONENTS) == "all"
    assert components.subset_name([]) == "head"


def test_unknown_component_lists_valid_names():
    with pytest.raises(UserError, match=r'unknown component "mlp".*emb, ln1, mha, ln2, fc1, fc2'):
        components.parse_subset("mha+mlp")
    with pytest.raises(UserError, match='did you mean "mha"'):
        components.parse_subset(["mhaa"])


@pytest.mark.parametrize("subset", ["mha", "ln1+fc2", "emb", "all", "head"])
def test_freeze_trains_exactly_the_subset_and_head(tiny_vit, subset):
    counts = components.freeze(tiny_vit, subset)
    chosen = components.parse_subset(subset)
    expected = set()
    for name, _ in tiny_vit.named_parameters():
        component, _ = components.parameter_component(name)
        if component == "head" or component in chosen:
            expected.add(name)
    assert trainable_names(tiny_vit) == expected
    assert {"head.weight", "head.bias", "norm.weight", "norm.bias"} <= expected
    assert sum(counts.values()) == sum(p.numel() for p in tiny_vit.parameters() if p.requires_grad)
    for c in components.COMPONENTS:
        assert (counts[c] > 0) == (c in chosen)


def test_parameter_mapping_matches_timm_modules(tiny_vit):
    d = 32
    counts = components.count_parameters(tiny_vit)
    assert counts["ln1"] == counts["ln2"] == 2 * (2 * d)  # gamma + beta, 2 blocks
    assert counts["mha"] == 2 * (3 * d * d + 3 * d + d * d + d)  # qkv + proj
    assert counts["fc1"] == 2 * (d * 4 * d + 4 * d)
    assert counts["fc2"] == 2 * (4 * d * d + d)
    assert counts["emb"] == 3 * 8 * 8 * d + d + d + 17 * d  # patch conv, bias, cls, pos
    assert counts["head"] == 2 * d + d * 5 + 5
    assert sum(counts.values()) == sum(p.numel() for p in tiny_vit.parameters())


def test_freeze_block_range(tiny_vit):
    components.freeze(tiny_vit, "mha+emb", blocks=[1])
    names = trainable_names(tiny_vit)
    assert any(n.startswith("blocks.1.attn.") for n in names)
    assert not any(n.startswith("blocks.0.attn.") for n in names)
    assert "pos_embed" in names  # emb is model level, unaffected by the block range
    with pytest.raises(UserError, match="out of range"):
        components.freeze(tiny_vit, "mha", blocks=[5])


def test_layer_scale_and_registers_are_mapped():
    model = timm.create_model(
        "vit_small_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        init_values=1e-5,
        reg_tokens=2,
        num_classes=3,
        depth=1,
    )
    components.freeze(model, "mha")
    names = trainable_names(model)
    assert "blocks.0.ls1.gamma" in names and "blocks.0.ls2.gamma" not in names
    assert components.parameter_component("reg_token") == ("emb", None)


def test_unsupported_parameter_fails_loudly():
    with pytest.raises(UserError, match="belongs to no known ViT component"):
        components.parameter_component("stages.0.conv.weight")
