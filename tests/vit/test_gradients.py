"""Gradient criteria (grad_norm, Auto-RGN) against a naive computation on a tiny ViT."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from vitplast_tune.errors import UserError
from vitplast_tune.predictors.scores import aggregate_criteria, subset_criteria
from vitplast_tune.vit.gradients import gradient_table

# The naive mapping, written out by hand for a timm ViT block (independent of components.py).
NAIVE = {"ln1": ["norm1."], "mha": ["attn."], "ln2": ["norm2."], "fc1": ["mlp.fc1."], "fc2": ["mlp.fc2."]}


def tiny_vit(seed: int = 0) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer(img_size=16, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=3)


def batches(seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in (5, 3)]


def naive_gradients(model, data) -> dict[str, torch.Tensor]:
    """Gradient of the mean loss over every image of every batch, one backward over the concatenation."""
    model.zero_grad()
    images, labels = torch.cat([b[0] for b in data]), torch.cat([b[1] for b in data])
    F.cross_entropy(model(images), labels).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def naive_norms(model, grads, block: int, component: str) -> tuple[float, float]:
    prefixes = [f"blocks.{block}.{p}" for p in NAIVE[component]]
    names = [n for n, _ in model.named_parameters() if n.startswith(tuple(prefixes))]
    g = math.sqrt(sum(float(grads[n].pow(2).sum()) for n in names))
    w = math.sqrt(sum(float(dict(model.named_parameters())[n].detach().pow(2).sum()) for n in names))
    return g, w


def test_gradient_table_matches_a_naive_per_layer_computation():
    model, data = tiny_vit().eval(), batches()
    table = gradient_table(model, data).set_index(["component", "layer"])
    grads = naive_gradients(model, data)
    for block in range(2):
        for component in NAIVE:
            g, w = naive_norms(model, grads, block, component)
            row = table.loc[(component, block)]
            assert row["grad_norm"] == pytest.approx(g, rel=1e-4)
            assert row["rgn"] == pytest.approx(g / w, rel=1e-4)
    emb = [n for n in grads if n.startswith(("patch_embed.", "cls_token", "pos_embed"))]
    emb_norm = math.sqrt(sum(float(grads[n].pow(2).sum()) for n in emb))
    assert table.loc[("emb", -1), "grad_norm"] == pytest.approx(emb_norm, rel=1e-4)
    assert "head" not in set(table.index.get_level_values("component"))


def test_subset_scores_are_norms_of_the_whole_subset_vector():
    model, data = tiny_vit().eval(), batches()
    table = gradient_table(model, data)
    grads = naive_gradients(model, data)
    pairs = [naive_norms(model, grads, b, c) for b in range(2) for c in ("mha", "fc1")]
    g, w = math.sqrt(sum(p[0] ** 2 for p in pairs)), math.sqrt(sum(p[1] ** 2 for p in pairs))
    scores = subset_criteria(table, "fc1+mha")
    assert scores["grad_norm"] == pytest.approx(g, rel=1e-4)
    assert scores["rgn"] == pytest.approx(g / w, rel=1e-4)
    per = aggregate_criteria(table).set_index("component")
    assert scores["rgn_mean"] == pytest.approx((per.loc["mha", "rgn_mean"] + per.loc["fc1", "rgn_mean"]) / 2)
    assert all(math.isnan(v) for v in subset_criteria(table, "head").values())


def test_model_is_left_as_it_was():
    model = tiny_vit().train()
    for p in model.blocks[0].parameters():
        p.requires_grad_(False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    gradient_table(model, batches())
    assert model.training and not any(p.requires_grad for p in model.blocks[0].parameters())
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    with pytest.raises(UserError, match="at least one batch"):
        gradient_table(model, [])
