"""compute_plasticity against a naive per-pair computation; batching, subset scores, errors."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from vitplast_tune.components import BLOCK_COMPONENTS
from vitplast_tune.errors import UserError
from vitplast_tune.freezing import count_parameters
from vitplast_tune.predictors.scores import aggregate_plasticity, subset_scores
from vitplast_tune.vit.families.timm_vit import LAYOUT as VIT
from vitplast_tune.vit.plasticity import compute_plasticity


def tiny_vit(seed: int = 0, **kwargs) -> VisionTransformer:
    torch.manual_seed(seed)
    args = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    model = VisionTransformer(**{**args, **kwargs}).double().eval()
    with torch.no_grad():  # non-trivial norms, biases and tokens (timm initialises some of them to 0 or 1)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias") or "token" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def images(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def embedding(model: VisionTransformer, pixels: torch.Tensor) -> torch.Tensor:
    """The real input of block 0, captured in a plain forward pass."""
    seen = []
    handle = model.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        model(pixels)
    handle.remove()
    return seen[0]


def naive(model: VisionTransformer, ref: torch.Tensor, down: torch.Tensor, variant: str) -> pd.DataFrame:
    """One pair at a time, every component written out by hand."""
    ratios: dict[tuple[str, int], list[float]] = {}

    def add(component, layer, out_x, out_y, in_x, in_y):
        ratio = torch.linalg.norm(out_x - out_y) / torch.linalg.norm(in_x - in_y)
        ratios.setdefault((component, layer), []).append(float(ratio))

    def block_io(block, h):
        """(input, output) of each block component inside the normal residual forward pass."""
        a = block.norm1(h)
        attn = block.attn(a)
        h2 = h + attn
        b = block.norm2(h2)
        f1 = block.mlp.fc1(b)
        act = block.mlp.act(f1)
        f2 = block.mlp.fc2(act)
        io = {"ln1": (h, a), "mha": (a, attn), "ln2": (h2, b), "fc1": (b, f1), "fc2": (act, f2)}
        return io, h2 + f2

    with torch.no_grad():
        for i in range(min(len(ref), len(down))):
            x, y = ref[i : i + 1], down[i : i + 1]
            ex, ey = embedding(model, x), embedding(model, y)
            add("emb", 0, ex, ey, x, y)
            hx, hy = ex, ey
            for layer, block in enumerate(model.blocks):
                if variant == "paper":
                    for component, fn in {
                        "ln1": block.norm1,
                        "mha": block.attn,
                        "ln2": block.norm2,
                        "fc1": block.mlp.fc1,
                        "fc2": lambda e, fc2=block.mlp.fc2: fc2(F.pad(e, (0, fc2.in_features - e.shape[-1]))),
                    }.items():
                        add(component, layer, fn(ex), fn(ey), ex, ey)
                else:
                    io_x, hx = block_io(block, hx)
                    io_y, hy = block_io(block, hy)
                    for component in BLOCK_COMPONENTS:
                        add(
                            component,
                            layer,
                            io_x[component][1],
                            io_y[component][1],
                            io_x[component][0],
                            io_y[component][0],
                        )
    rows = [
        {"component": c, "layer": layer, "plasticity": np.mean(v), "std": np.std(v, ddof=1), "n_pairs": len(v)}
        for (c, layer), v in ratios.items()
    ]
    return pd.DataFrame(rows)


def check_against(table: pd.DataFrame, expected: pd.DataFrame) -> None:
    merged = expected.merge(table, on=["component", "layer"], suffixes=("_naive", ""))
    assert len(merged) == len(expected) == len(table)
    np.testing.assert_allclose(merged["plasticity"], merged["plasticity_naive"], rtol=1e-9)
    np.testing.assert_allclose(merged["std"], merged["std_naive"], rtol=1e-6)
    np.testing.assert_allclose(merged["sem"], merged["std"] / np.sqrt(merged["n_pairs"]))
    assert (merged["n_pairs"] == merged["n_pairs_naive"]).all()


@pytest.mark.parametrize("variant", ["paper", "in_network"])
def test_matches_naive_per_pair_computation(variant):
    model = tiny_vit()
    ref, down = images(7, 1), images(7, 2) * 0.5 + 0.1
    table = compute_plasticity(model, ref, down, variant=variant, batch_size=3, device="cpu")
    assert list(table.columns) == ["component", "layer", "plasticity", "std", "sem", "n_pairs"]
    assert table.attrs["variant"] == variant
    assert table.iloc[0][["component", "layer"]].tolist() == ["emb", 0]
    check_against(table, naive(model, ref, down, variant))


def test_fc2_shortcut_equals_zero_padding_for_any_hidden_width():
    model = tiny_vit(mlp_ratio=3.0)  # hidden width 96 = 3 x 32
    ref, down = images(5, 3), images(5, 4)
    table = compute_plasticity(model, ref, down, batch_size=2, device="cpu")
    expected = naive(model, ref, down, "paper")
    fc2 = lambda t: t[t["component"] == "fc2"].sort_values("layer")["plasticity"].to_numpy()
    np.testing.assert_allclose(fc2(table), fc2(expected), rtol=1e-10)


def test_register_tokens_and_no_embed_class():
    model = tiny_vit(reg_tokens=2, no_embed_class=True)
    ref, down = images(4, 5), images(4, 6)
    check_against(compute_plasticity(model, ref, down, batch_size=3, device="cpu"), naive(model, ref, down, "paper"))


def test_tensors_and_iterables_of_batches_give_the_same_table():
    model = tiny_vit()
    ref, down = images(10, 7), images(12, 8)
    whole = compute_plasticity(model, ref, down, batch_size=64, device="cpu")
    ref_batches = [ref[:3], ref[3:8], ref[8:]]
    down_batches = [(down[i : i + 4], torch.zeros(4)) for i in range(0, 12, 4)]  # (images, labels) like a loader
    for batch_size in (1, 3, 4):
        split = compute_plasticity(model, iter(ref_batches), iter(down_batches), batch_size=batch_size, device="cpu")
        pd.testing.assert_frame_equal(split, whole, rtol=1e-10)
    assert (whole["n_pairs"] == 10).all()  # stops at the shorter


def test_max_pairs_and_mode_restored():
    model = tiny_vit().train()
    model.blocks[1].eval()
    table = compute_plasticity(model, images(9, 9), images(9, 10), batch_size=4, max_pairs=6, device="cpu")
    assert (table["n_pairs"] == 6).all()
    assert model.training and model.blocks[0].training and not model.blocks[1].training
    expected = compute_plasticity(model, images(9, 9)[:6], images(9, 10)[:6], device="cpu")
    pd.testing.assert_frame_equal(table, expected, rtol=1e-10)


def test_a_float32_model_gives_finite_scores_and_a_rank_for_each_block_component():
    model = tiny_vit().float()
    table = compute_plasticity(model, images(6, 11).float(), images(6, 12).float(), device="cpu")
    assert np.isfinite(table["plasticity"]).all() and len(table) == 1 + 5 * 2
    ranking = aggregate_plasticity(table)
    assert ranking["component"].tolist() == ["emb", "ln1", "mha", "ln2", "fc1", "fc2"]
    assert pd.isna(ranking["rank"].iloc[0]) and sorted(ranking["rank"].iloc[1:]) == [1, 2, 3, 4, 5]
    means = table.groupby("component")["plasticity"].mean()
    np.testing.assert_allclose(ranking.set_index("component")["plasticity"], means.reindex(ranking["component"]))


def test_identical_pairs_are_skipped():
    model = tiny_vit()
    ref = images(4, 13)
    down = ref.clone()
    down[2:] = images(2, 14)
    table = compute_plasticity(model, ref, down, device="cpu")
    assert (table["n_pairs"] == 2).all()
    with pytest.raises(UserError, match="no image pairs"):
        compute_plasticity(model, ref, ref, device="cpu")


def test_subset_scores_follow_from_the_table():
    model = tiny_vit()
    table = compute_plasticity(model, images(4, 15), images(4, 16), device="cpu")
    counts = count_parameters(model, layout=VIT)
    means = table.groupby("component")["plasticity"].mean()
    scores = subset_scores(table, "fc1+mha", counts)
    assert scores["plasticity_mean"] == pytest.approx((means["mha"] + means["fc1"]) / 2)
    assert scores["plasticity_max"] == pytest.approx(max(means["mha"], means["fc1"]))
    weighted = (means["mha"] * counts["mha"] + means["fc1"] * counts["fc1"]) / (counts["mha"] + counts["fc1"])
    assert scores["plasticity_weighted"] == pytest.approx(weighted)
    assert subset_scores(table, ["ln1"], counts)["plasticity_max"] == pytest.approx(means["ln1"])
    assert subset_scores(table, "all", counts)["plasticity_mean"] == pytest.approx(means.drop("emb").mean())
    assert all(math.isnan(v) for v in subset_scores(table, "head", counts).values())


def test_errors():
    model = tiny_vit()
    table = compute_plasticity(model, images(3, 17), images(3, 18), device="cpu")
    counts = count_parameters(model, layout=VIT)
    with pytest.raises(UserError, match='unknown component "mhaa"'):
        subset_scores(table, "mhaa+fc1", counts)
    with pytest.raises(UserError, match="no rows for mha"):
        subset_scores(table[table["component"] != "mha"], "emb+mha", counts)
    with pytest.raises(UserError, match="unknown component"):
        aggregate_plasticity(table.assign(component="attn"))
    with pytest.raises(UserError, match="variant"):
        compute_plasticity(model, images(3, 17), images(3, 18), variant="papr")
    with pytest.raises(UserError, match=r"\(N, C, H, W\)"):
        compute_plasticity(model, images(3, 17)[0], images(3, 18))
    with pytest.raises(
        UserError, match="the model is a Linear, of no supported model family; supported: timm-vit, timm-eva"
    ):
        compute_plasticity(torch.nn.Linear(2, 2), images(3, 17), images(3, 18))


def test_report_writes_table_json_and_plot(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from vitplast_tune.predictors.report import plasticity_report

    report = plasticity_report(
        "vit_testbed_patch8_32",
        pretrained=False,
        dataset="digits",
        reference="digits",
        reference_split="train",
        batch_size=16,
        max_pairs=40,
        out_dir=tmp_path,
        device="cpu",
    )
    assert (report.table["n_pairs"] == 40).all()
    assert report.ranking["component"].tolist() == ["emb", "ln1", "mha", "ln2", "fc1", "fc2"]
    saved = pd.read_csv(report.files["csv"])
    assert saved[["component", "layer"]].equals(report.table[["component", "layer"]])
    payload = json.loads(report.files["json"].read_text())
    assert payload["variant"] == "paper" and payload["n_pairs"] == 40 and len(payload["ranking"]) == 6
    assert report.files["png"].stat().st_size > 1000

    script = Path(__file__).resolve().parents[2] / "scripts" / "plasticity.py"
    args = ["--no-pretrained", "--model", "vit_testbed_patch8_32", "--dataset", "digitz"]
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith('error: unknown dataset "digitz"') and proc.stderr.count("\n") == 1
