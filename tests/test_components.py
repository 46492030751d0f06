import pytest
import timm

from vitplast_tune import components, freezing
from vitplast_tune.errors import UserError
from vitplast_tune.vit.families.timm_vit import LAYOUT as VIT


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
    counts = freezing.freeze(tiny_vit, subset, layout=VIT)
    chosen = components.parse_subset(subset)
    expected = set()
    for name, _ in tiny_vit.named_parameters():
        component, _ = freezing.parameter_component(name, VIT)
        if component == "head" or component in chosen:
            expected.add(name)
    assert trainable_names(tiny_vit) == expected
    assert {"head.weight", "head.bias", "norm.weight", "norm.bias"} <= expected
    assert sum(counts.values()) == sum(p.numel() for p in tiny_vit.parameters() if p.requires_grad)
    for c in components.COMPONENTS:
        assert (counts[c] > 0) == (c in chosen)


def test_parameter_mapping_matches_timm_modules(tiny_vit):
    d = 32
    counts = freezing.count_parameters(tiny_vit, layout=VIT)
    assert counts["ln1"] == counts["ln2"] == 2 * (2 * d)  # gamma + beta, 2 blocks
    assert counts["mha"] == 2 * (3 * d * d + 3 * d + d * d + d)  # qkv + proj
    assert counts["fc1"] == 2 * (d * 4 * d + 4 * d)
    assert counts["fc2"] == 2 * (4 * d * d + d)
    assert counts["emb"] == 3 * 8 * 8 * d + d + d + 17 * d  # patch conv, bias, cls, pos
    assert counts["head"] == 2 * d + d * 5 + 5
    assert sum(counts.values()) == sum(p.numel() for p in tiny_vit.parameters())


def test_freeze_block_range(tiny_vit):
    freezing.freeze(tiny_vit, "mha+emb", blocks=[1], layout=VIT)
    names = trainable_names(tiny_vit)
    assert any(n.startswith("blocks.1.attn.") for n in names)
    assert not any(n.startswith("blocks.0.attn.") for n in names)
    assert "pos_embed" in names  # emb is model level, unaffected by the block range
    with pytest.raises(UserError, match="out of range"):
        freezing.freeze(tiny_vit, "mha", blocks=[5], layout=VIT)


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
    freezing.freeze(model, "mha", layout=VIT)
    names = trainable_names(model)
    assert "blocks.0.ls1.gamma" in names and "blocks.0.ls2.gamma" not in names
    assert freezing.parameter_component("reg_token", VIT) == ("emb", None)


def test_unsupported_parameter_fails_loudly():
    with pytest.raises(UserError, match="belongs to no component of the timm-vit family's layout"):
        freezing.parameter_component("stages.0.conv.weight", VIT)


def test_methods_are_part_of_a_subsets_name():
    assert components.parse_methods("fc1+mha:lora") == {"mha": "lora", "fc1": "full"}
    assert components.subset_name("fc1+mha:LoRA") == "mha:lora+fc1"
    assert components.subset_name({"mha": "lora", "fc1": "full", "ln1": "frozen"}) == "mha:lora+fc1"
    assert components.subset_name(["mha:full", "fc2"]) == "mha+fc2"  # full is the default, left out of the name
    assert components.subset_name("all:bitfit") == "all:bitfit" and components.subset_name("all:full") == "all"
    assert components.parse_subset("mha:lora+fc1") == ("mha", "fc1")
    assert components.subset_name("mha:frozen") == "head"
    assert components.method_label("fc2:lora+mha") == "full+lora" and components.method_label("head") == "head"
    with pytest.raises(UserError, match=r'ln1 cannot train by "lora" \(LoRA adapts the linear layers'):
        components.parse_methods("ln1:lora")
    with pytest.raises(UserError, match='did you mean "bitfit"'):
        components.parse_methods("mha:bitfti")
    with pytest.raises(UserError, match="emb cannot train by"):
        components.parse_methods("all:lora")


def test_depth_names_thirds_or_a_range_of_blocks():
    assert [components.depth_blocks(d, 4) for d in ("first", "middle", "last")] == [[0], [1, 2], [3]]
    assert [components.depth_blocks(d, 12) for d in ("first", "middle", "last")] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
    ]
    assert components.depth_blocks("all", 12) is None and components.depth_blocks("2-4", 12) == [2, 3, 4]
    assert components.depth_blocks("5", 12) == [5] and components.depth_blocks(3, 4) == [3]  # YAML: 3, not "3"
    assert components.contiguous_depths(3) == ["0", "1", "2", "0-1", "1-2", "0-2"]
    with pytest.raises(UserError, match="out of range"):
        components.depth_blocks("2-4", 4)
    with pytest.raises(UserError, match='unknown depth "lats" \\(did you mean "last"'):
        components.check_depth("lats")
    with pytest.raises(UserError, match="unknown depth"):
        components.check_depth("3-1")
    with pytest.raises(UserError, match="at least 3 blocks"):
        components.depth_blocks("middle", 2)


def test_bitfit_freezes_all_but_biases(tiny_vit):
    counts = freezing.freeze(tiny_vit, "mha:bitfit+ln2", blocks=[0], layout=VIT)
    names = trainable_names(tiny_vit)
    assert names - {"head.weight", "head.bias", "norm.weight", "norm.bias"} == {
        "blocks.0.attn.qkv.bias",
        "blocks.0.attn.proj.bias",
        "blocks.0.norm2.weight",
        "blocks.0.norm2.bias",
    }
    assert counts["mha"] == 3 * 32 + 32 and counts["ln2"] == 2 * 32
