"""Gradient criteria (grad_norm, grad_norm_ratio, Auto-RGN) against naive computations on a tiny ViT."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data import transforms
from vitplast_tune.data.batches import epoch_permutation
from vitplast_tune.errors import UserError
from vitplast_tune.predictors.scores import (
    aggregate_criteria,
    criteria_summary,
    gradient_criteria,
    subset_criteria,
    top_by_seed,
)
from vitplast_tune.vit import models
from vitplast_tune.vit.gradients import gradient_table
from vitplast_tune.vit.measure import measure_gradients
from vitplast_tune.vit.training import build_run

# The naive mapping, written out by hand for a timm ViT (independent of components.py).
NAIVE = {"ln1": ["norm1."], "mha": ["attn."], "ln2": ["norm2."], "fc1": ["mlp.fc1."], "fc2": ["mlp.fc2."]}
EMB = ("patch_embed.", "cls_token", "pos_embed")


def tiny_vit(seed: int = 0) -> VisionTransformer:
    """A random tiny ViT whose every tensor is moved off its initialisation (zero biases, unit norms), as if trained."""
    torch.manual_seed(seed)
    model = VisionTransformer(img_size=16, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def batches(seed: int = 1, dtype=torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, 3, 16, 16, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)) for n in (5, 3, 4)
    ]


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


def naive_auto_rgn(model, data) -> dict[str, float]:
    """Auto-RGN per parameter tensor, as its authors compute it: for each batch, the gradient of the batch's mean
    cross-entropy, ||g|| / ||theta|| per tensor; then the mean of those ratios over the batches."""
    ratios: dict[str, list[float]] = {}
    for images, labels in data:
        model.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        for name, p in model.named_parameters():
            if float(p.detach().norm()) > 0:  # a tensor of norm 0 has no ratio: left out of every mean
                ratios.setdefault(name, []).append(float(p.grad.norm()) / float(p.detach().norm()))
    return {name: sum(r) / len(r) for name, r in ratios.items()}


def naive_names(model, component: str, block: int | None = None) -> list[str]:
    """The tensors (of non-zero norm) of one component, in one block or in all of them."""
    named = [(n, p) for n, p in model.named_parameters() if float(p.detach().norm()) > 0]
    if component == "emb":
        return [n for n, _ in named if n.startswith(EMB)]
    blocks = [block] if block is not None else range(len(model.blocks))
    prefixes = tuple(f"blocks.{b}.{p}" for b in blocks for p in NAIVE[component])
    return [n for n, _ in named if n.startswith(prefixes)]


def test_auto_rgn_matches_a_naive_per_tensor_computation():
    model, data = tiny_vit().double().eval(), batches(dtype=torch.float64)
    with torch.no_grad():
        model.blocks[0].mlp.fc1.bias.zero_()  # no ratio: Auto-RGN of (fc1, block 0) is its weight's alone
    naive = naive_auto_rgn(model, data)
    table = gradient_table(model, data)
    per_layer = gradient_criteria(table).set_index(["component", "layer"])
    per_component = aggregate_criteria(table).set_index("component")
    for component in NAIVE:
        for block in range(2):
            names = naive_names(model, component, block)
            expected = sum(naive[n] for n in names) / len(names)
            assert per_layer.loc[(component, block), "auto_rgn"] == pytest.approx(expected, rel=1e-6)
            assert per_layer.loc[(component, block), "tensors"] == len(names)
        names = naive_names(model, component)
        assert per_component.loc[component, "auto_rgn"] == pytest.approx(
            sum(naive[n] for n in names) / len(names), rel=1e-6
        )
    assert per_layer.loc[("fc1", 0), "tensors"] == 1
    emb = naive_names(model, "emb")
    assert per_component.loc["emb", "auto_rgn"] == pytest.approx(sum(naive[n] for n in emb) / len(emb), rel=1e-6)
    mha, fc1 = (sum(naive[n] for n in naive_names(model, c)) / len(naive_names(model, c)) for c in ("mha", "fc1"))
    assert subset_criteria(table, "fc1+mha")["auto_rgn"] == pytest.approx((mha + fc1) / 2, rel=1e-6)
    # A bias counts as much as a weight matrix: Auto-RGN is not the merged ratio of the whole vector
    assert not np.allclose(per_component["auto_rgn"], per_component["grad_norm_ratio"], rtol=0.05)


def test_norm_criteria_match_a_naive_per_layer_computation():
    model, data = tiny_vit().eval(), batches()
    table = gradient_criteria(gradient_table(model, data)).set_index(["component", "layer"])
    grads = naive_gradients(model, data)
    for block in range(2):
        for component in NAIVE:
            g, w = naive_norms(model, grads, block, component)
            row = table.loc[(component, block)]
            assert row["grad_norm"] == pytest.approx(g, rel=1e-4)
            assert row["grad_norm_ratio"] == pytest.approx(g / w, rel=1e-4)
    emb = [n for n in grads if n.startswith(EMB)]
    emb_norm = math.sqrt(sum(float(grads[n].pow(2).sum()) for n in emb))
    assert table.loc[("emb", -1), "grad_norm"] == pytest.approx(emb_norm, rel=1e-4)
    assert "head" not in set(table.index.get_level_values("component"))


def test_subset_norms_are_norms_of_the_whole_subset_vector():
    model, data = tiny_vit().eval(), batches()
    table = gradient_table(model, data)
    grads = naive_gradients(model, data)
    pairs = [naive_norms(model, grads, b, c) for b in range(2) for c in ("mha", "fc1")]
    g, w = math.sqrt(sum(p[0] ** 2 for p in pairs)), math.sqrt(sum(p[1] ** 2 for p in pairs))
    scores = subset_criteria(table, "fc1+mha")
    assert scores["grad_norm"] == pytest.approx(g, rel=1e-4)
    assert scores["grad_norm_ratio"] == pytest.approx(g / w, rel=1e-4)
    assert all(math.isnan(v) for v in subset_criteria(table, "head").values())


def test_several_heads_give_the_mean_and_spread_and_say_when_the_ranking_changes():
    data = batches()
    tables = [gradient_table(tiny_vit(seed).eval(), data).assign(head_seed=seed) for seed in (0, 1, 2)]
    table = pd.concat(tables, ignore_index=True)
    one = [subset_criteria(t.drop(columns="head_seed"), "mha+fc2") for t in tables]
    both = subset_criteria(table, "mha+fc2")
    for name in both:
        assert both[name] == pytest.approx(np.mean([s[name] for s in one]), rel=1e-9)
    summary = criteria_summary(table).set_index(["criterion", "component"])
    per_seed = [aggregate_criteria(t.drop(columns="head_seed")).set_index("component")["auto_rgn"] for t in tables]
    fc2 = [s["fc2"] for s in per_seed]
    assert summary.loc[("auto_rgn", "fc2"), "mean"] == pytest.approx(np.mean(fc2))
    assert summary.loc[("auto_rgn", "fc2"), "std"] == pytest.approx(np.std(fc2, ddof=1))
    orders = {tuple(s.sort_values(ascending=False).index) for s in per_seed}
    assert bool(summary.loc[("auto_rgn", "fc2"), "rank_changes"]) == (len(orders) > 1)
    tops = top_by_seed(table, "auto_rgn")
    assert tops.sum() == 3 and tops.index[0] in {s.idxmax() for s in per_seed}


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


def test_measure_gradients_uses_unaugmented_training_images_and_several_heads():
    """The testbed on digits: the table for each head seed equals gradient_table of a model built with that seed
    on the first shuffled training images through the evaluation transform, gathered here by hand."""
    cfg = FinetuneConfig(batch_size=16, seed=3)
    table = measure_gradients(cfg, num_batches=2, head_seeds=2)
    assert sorted(table["head_seed"].unique()) == [3, 4]
    _, splits = build_run(cfg)
    train = splits.train
    order = epoch_permutation(len(train), cfg.seed, 0)  # the run's shuffled order, first epoch
    data = []
    for b in range(2):
        idx = train.indices[order[b * 16 : (b + 1) * 16].numpy()]
        raw = torch.from_numpy(train.images[idx])
        images = transforms.batch_transform(raw, train.data_config, train=False)  # the evaluation transform
        data.append((images, torch.from_numpy(train.labels[idx].astype(np.int64))))
    for seed in (3, 4):
        torch.manual_seed(seed)
        model = models.create_model(cfg.model, splits.num_classes)
        expected = gradient_table(model, data)
        got = table[table["head_seed"] == seed].drop(columns="head_seed").reset_index(drop=True)
        np.testing.assert_allclose(got["rgn_sum"], expected["rgn_sum"], rtol=1e-6)
        np.testing.assert_allclose(got["grad_sq"], expected["grad_sq"], rtol=1e-6)
    heads = table.groupby("head_seed")["rgn_sum"].sum()
    assert heads[3] != heads[4]  # another head, other gradients
