import copy
import math

import numpy as np
import pytest
import torch

from vitplast_tune.data import batches, datasets, splits
from vitplast_tune.errors import UserError
from vitplast_tune.vit.optim import warmup_cosine
from vitplast_tune.vit.training import DivergedError, FinetuneConfig, finetune

FAST = dict(
    model="vit_testbed_patch8_32",
    pretrained=False,
    max_steps=12,
    eval_every=4,
    warmup_steps=3,
    batch_size=32,
    threads=1,
    lr=0.05,
)


def run(**overrides):
    reports = []
    cfg = FinetuneConfig(**{**FAST, **overrides})
    final = finetune(cfg, report=lambda metrics, state: reports.append((metrics, copy.deepcopy(state))))
    return final.metrics, reports


def test_warmup_follows_the_step_budget_when_a_fraction_is_set():
    assert FinetuneConfig(max_steps=10000, warmup_steps=80).warmup == 80
    assert FinetuneConfig(max_steps=10000, warmup_fraction=0.2).warmup == 2000
    assert FinetuneConfig(max_steps=400, warmup_fraction=0.2).warmup == 80
    with pytest.raises(UserError, match="warmup_fraction"):
        FinetuneConfig(warmup_fraction=1.5).validate()


def test_warmup_cosine_shape():
    assert warmup_cosine(0, 100, 10) == pytest.approx(0.1)
    assert warmup_cosine(9, 100, 10) == pytest.approx(1.0)
    assert warmup_cosine(10, 100, 10) == pytest.approx(1.0)
    assert warmup_cosine(55, 100, 10) == pytest.approx(0.5)
    assert warmup_cosine(100, 100, 10) == pytest.approx(0.0)


def test_reports_every_eval_with_metrics_and_resumable_state():
    final, reports = run(components="mha")
    assert [m["step"] for m, _ in reports] == [4, 8, 12]
    for metrics, state in reports:
        assert {"train_loss", "val_acc", "val_loss", "best_val_acc", "trainable_params", "current_lr"} <= set(metrics)
        assert 0.0 <= metrics["val_acc"] <= 1.0 and math.isfinite(metrics["train_loss"])
        assert state["step"] == metrics["step"]
        assert all(".attn." in n or n.startswith(("head.", "norm.")) for n in state["trainable"])
    assert final["best_val_acc"] == max(m["val_acc"] for m, _ in reports)
    assert 0.0 <= final["test_acc"] <= 1.0
    assert final["trainable_params"] == reports[0][0]["trainable_params"]


def test_same_seed_same_run_and_other_seed_differs():
    a, _ = run(components="fc1", seed=3)
    b, _ = run(components="fc1", seed=3)
    c, _ = run(components="fc1", seed=4)
    assert a["train_loss"] == b["train_loss"] and a["val_acc"] == b["val_acc"]
    assert a["train_loss"] != c["train_loss"]


def test_resume_from_state_matches_an_uninterrupted_run():
    full, reports = run(components="ln1+fc2", seed=1)
    _, state = reports[0]  # as if the trial died after its first checkpoint
    saved = torch.load(_roundtrip(state), weights_only=True)
    resumed = []
    _, final = finetune(
        FinetuneConfig(**{**FAST, "components": "ln1+fc2", "seed": 1}),
        report=lambda m, s: resumed.append(m),
        resume=saved,
    )
    assert [m["step"] for m in resumed] == [8, 12]
    assert final["train_loss"] == pytest.approx(full["train_loss"], rel=1e-5)
    assert final["val_acc"] == full["val_acc"]


def test_a_resumed_run_counts_the_seconds_before_its_checkpoint():
    # What a trial cost is every second it trained, before an interruption too: the per-GPU-hour objective and the
    # search's cost read time_in_steps_s, so a resumed trial must not look cheaper than one that ran through.
    _, reports = run(components="fc1", seed=1)
    metrics, state = reports[0]
    saved = torch.load(_roundtrip(state), weights_only=True)
    assert saved["timing"]["time_in_steps_s"] == metrics["time_in_steps_s"] > 0
    saved["timing"] = {"time_setup_s": 100.0, "time_in_steps_s": 1000.0, "time_in_eval_s": 10.0}
    resumed = []
    finetune(
        FinetuneConfig(**{**FAST, "components": "fc1", "seed": 1}), report=lambda m, s: resumed.append(m), resume=saved
    )
    first, last = resumed[0], resumed[-1]
    assert 1000.0 < first["time_in_steps_s"] < last["time_in_steps_s"] < 1000.0 + 60
    assert 100.0 < last["time_setup_s"] < 160.0 and 10.0 < last["time_in_eval_s"] < 70.0
    assert last["val_acc_per_gpu_hour"] == pytest.approx(last["val_acc"] * 3600 / last["time_in_steps_s"])


def _roundtrip(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_divergence_raises():
    with pytest.raises(DivergedError, match="loss became nan"):
        run(components="all", lr=1e6, grad_clip=0.0, optimizer="sgd", momentum=0.0, max_steps=8, eval_every=4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"lr": 0.0}, "lr must be positive"),
        ({"lr": -1.0}, "lr must be positive"),
        ({"optimizer": "adam"}, 'did you mean "adamw"'),
        ({"components": "mlp"}, 'unknown component "mlp"'),
        ({"max_steps": 0}, "max_steps must be positive"),
    ],
)
def test_invalid_configs(overrides, message):
    with pytest.raises(UserError, match=message):
        FinetuneConfig(**{**FAST, **overrides}).validate()


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(UserError, match='unknown setting "learning_rate"'):
        FinetuneConfig.from_dict({"learning_rate": 0.1})


def test_linear_probe_on_cached_features_matches_the_full_forward():
    # The cache holds features of the evaluation transform; without training crops the two runs see the same inputs.
    cached, cached_reports = run(components="head", seed=2, augment="none")
    plain, plain_reports = run(components="head", seed=2, cache_features=False, augment="none")
    assert [m["step"] for m, _ in cached_reports] == [m["step"] for m, _ in plain_reports]
    for (a, _), (b, _) in zip(cached_reports, plain_reports):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        assert a["val_acc"] == pytest.approx(b["val_acc"], abs=1 / 250)
    assert cached["trainable_params"] == plain["trainable_params"]


def test_shared_decoded_dataset_gives_the_same_run():
    from vitplast_tune.vit import models

    decoded = datasets.decode_dataset("digits", models.pretrained_data_config("vit_testbed_patch8_32"))
    assert decoded is not None and decoded.images.shape == (1797, 1, 8, 8)
    reports = []
    _, shared = finetune(
        FinetuneConfig(**{**FAST, "components": "ln1", "seed": 5}),
        report=lambda m, s: reports.append(m),
        decoded=decoded,
    )
    alone, _ = run(components="ln1", seed=5)
    assert shared["train_loss"] == alone["train_loss"] and shared["val_acc"] == alone["val_acc"]


@pytest.mark.parametrize("path", ["auto", "per_image", "batched"])
def test_a_resumed_run_replays_the_same_augmented_batches_on_each_cpu_path(monkeypatch, path):
    monkeypatch.setattr(splits, "CPU_TRAIN_PATH", path)
    found = datasets.load_dataset("digits", {"input_size": (3, 32, 32), "mean": (0.5,) * 3, "std": (0.5,) * 3}, seed=0)
    stream = batches.train_batches(found.train, 32, seed=3)
    first = [next(stream) for _ in range(40)]  # past the first epoch (35 batches)
    resumed = batches.train_batches(found.train, 32, seed=3, start_step=37)
    replayed = [next(resumed) for _ in range(3)]
    for (a, la), (b, lb) in zip(first[37:], replayed):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(first[37][0], first[38][0])  # batches differ: the replay is not of a constant


def test_a_cpu_trial_crops_small_images_in_batches_and_large_ones_per_image(monkeypatch):
    from vitplast_tune.data import transforms

    small = {"input_size": (3, 32, 32), "mean": (0.5,) * 3, "std": (0.5,) * 3}
    train = datasets.load_dataset("digits", small, seed=0).train
    images, _ = train.batch(np.arange(8), torch.device("cpu"), seed=4)
    raw = torch.from_numpy(train.images[train.indices[:8]])
    assert torch.equal(images, transforms.batch_transform(raw, small, True, 4, train.augment))  # batched at 32 px
    assert splits.cpu_crops_per_image({**small, "input_size": (3, 224, 224)})  # per image at 224 px
    monkeypatch.setattr(splits, "CPU_TRAIN_PATH", "per_image")
    assert splits.cpu_crops_per_image(small)


def test_no_stale_gradients_sit_beside_a_forward_pass(monkeypatch):
    """Gradients are freed right after each optimizer step, so neither the next step's forward pass
    (its activations) nor an evaluation holds a whole set of them beside it (0.34 GB at ViT-B)."""
    from vitplast_tune.vit import building

    build = building.build_run
    held = []  # per forward pass: how many trainable parameters still had a gradient

    def build_and_watch(cfg, decoded=None):
        model, splits = build(cfg, decoded)
        model.register_forward_pre_hook(
            lambda module, args: held.append(sum(p.grad is not None for p in module.parameters()))
        )
        return model, splits

    monkeypatch.setattr(building, "build_run", build_and_watch)
    run(components="mha", max_steps=6, eval_every=3, eval_test=False)
    assert len(held) > 6  # the training steps and the evaluation batches
    assert held == [0] * len(held)


def test_gradient_checkpointing_trains_the_same_run(monkeypatch):
    """Recomputing each block's activations in the backward pass changes memory, not the run."""
    from vitplast_tune.vit import building

    built = []
    build = building.build_run
    monkeypatch.setattr(building, "build_run", lambda cfg, decoded=None: built.append(build(cfg, decoded)) or built[-1])
    plain, _ = run(components="mha+fc2", max_steps=4, eval_every=2)
    recomputed, _ = run(components="mha+fc2", max_steps=4, eval_every=2, grad_checkpointing=True)
    assert [model.grad_checkpointing for model, _ in built] == [False, True]
    for key in ("train_loss", "val_loss", "val_acc", "test_acc"):
        assert recomputed[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-6)


# ----------------------------------------------------------------------------- precision and the gradient scaler


def test_auto_precision_follows_the_device(monkeypatch):
    from vitplast_tune.vit.devices import resolve_precision

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_precision("auto", cpu) == "fp32"
    for chosen in ("bf16", "fp16", "fp32"):
        assert resolve_precision(chosen, cpu) == chosen == resolve_precision(chosen, cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert resolve_precision("auto", cuda) == "bf16"  # an Ampere or newer GPU
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert resolve_precision("auto", cuda) == "fp16"  # a T4 or V100: fp16 with a gradient scaler
    with pytest.raises(UserError, match='unknown precision "fp8"'):
        FinetuneConfig(precision="fp8").validate()


def test_a_plain_cuda_device_reports_the_gpu_it_computes_on_and_its_memory_cap(monkeypatch):
    """``finetune(device=torch.device("cuda"))``: torch's memory-fraction query wants an index, which plain ``cuda``
    lacks; the run reports ``cuda:0`` and its cap as a trial on ``cuda:0`` does."""
    from vitplast_tune.vit.devices import device_facts

    def fraction(device):  # as torch.cuda.get_per_process_memory_fraction checks its argument
        if not isinstance(device, int) and getattr(device, "index", None) is None:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        return 0.5

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", fraction, raising=False)
    expected = {"device": "cuda:0 NVIDIA H200", "gpu_memory_fraction": 0.5}
    assert device_facts(torch.device("cuda")) == expected == device_facts(torch.device("cuda", 0))


def _tiny_step(scaler, loss_factor: float, grad_clip: float = 0.5):
    """One step of a seeded linear layer under SGD, as the loop takes it (``backward``, then ``optimizer_step``);
    returns (stepped, weight before, weight after)."""
    from vitplast_tune.vit.optim import backward, optimizer_step

    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    before = layer.weight.detach().clone()
    loss = layer(torch.randn(8, 4)).pow(2).mean() * loss_factor
    backward(loss, scaler)
    stepped = optimizer_step(optimizer, list(layer.parameters()), grad_clip=grad_clip, scaler=scaler)
    assert all(p.grad is None for p in layer.parameters())  # freed either way
    return stepped, before, layer.weight.detach()


def test_the_gradient_scaler_skips_an_overflowed_step_and_unscales_before_clipping():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    stepped, before, after = _tiny_step(scaler, float("inf"))  # a fake overflow: every gradient is inf or nan
    assert not stepped and torch.equal(before, after)
    assert scaler.get_scale() == 2.0**15  # backed off
    stepped, before, scaled = _tiny_step(scaler, 1.0)
    assert stepped and not torch.equal(before, scaled)
    _, _, plain = _tiny_step(None, 1.0)  # no scaler: the same clipped step
    assert torch.allclose(scaled, plain, atol=1e-6)  # clipping saw the true gradients, not 32768x them


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_trains_on_cpu(precision):
    """bf16 and fp16 asked for explicitly run with CPU autocast (fp16 with a gradient scaler, saved for resuming)."""
    final, reports = run(components="mha+fc1", precision=precision, max_steps=8)
    assert math.isfinite(final["train_loss"]) and 0.0 <= final["test_acc"] <= 1.0
    assert final["amp_skipped_steps"] >= 0
    state = reports[-1][1]
    assert ("scaler" in state) == (precision == "fp16")
    if precision == "fp16":
        assert state["scaler"]["scale"] > 0
        _, resumed = finetune(
            FinetuneConfig(**{**FAST, "components": "mha+fc1", "precision": "fp16", "max_steps": 8}),
            resume=torch.load(_roundtrip(reports[0][1]), weights_only=True),
        )
        assert resumed["train_loss"] == pytest.approx(final["train_loss"], rel=1e-4)


# ----------------------------------------------------------------------------- timm's optimizer factory


def _trainable_model(components: str):
    from vitplast_tune import freezing as comp
    from vitplast_tune.vit import models
    from vitplast_tune.vit.families.registry import layout_of

    model = models.create_model("vit_testbed_patch8_32", 10, pretrained=False)
    comp.freeze(model, components, layout=layout_of(model))
    return model


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_no_weight_decay_on_biases_norms_and_position_embeddings(optimizer):
    from vitplast_tune.vit.optim import build_optimizer

    model = _trainable_model("emb+ln1+mha")
    cfg = FinetuneConfig(optimizer=optimizer, weight_decay=0.05)
    built = build_optimizer(cfg, model, torch.device("cpu"))
    decay_of = {id(p): g["weight_decay"] for g in built.param_groups for p in g["params"]}
    assert sum(len(g["params"]) for g in built.param_groups) == len(decay_of)  # each parameter once
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert {id(p) for p in trainable.values()} == set(decay_of)  # frozen parameters are not optimised
    norms = {
        f"{m}.{n}"
        for m, module in model.named_modules()
        if isinstance(module, torch.nn.LayerNorm)
        for n, _ in module.named_parameters()
    }
    exempt = {n for n in trainable if n.endswith(".bias") or n in norms or n in ("pos_embed", "cls_token")}
    assert {"pos_embed", "cls_token", "blocks.0.norm1.weight", "norm.weight", "head.bias"} <= exempt
    for name, p in trainable.items():
        assert decay_of[id(p)] == (0.0 if name in exempt else 0.05), name
    assert isinstance(built, torch.optim.SGD if optimizer == "sgd" else torch.optim.AdamW)
    if optimizer == "sgd":
        assert all(g["momentum"] == 0.9 and not g["nesterov"] for g in built.param_groups)  # classical momentum


def test_without_weight_decay_the_factory_steps_as_plain_sgd():
    """At weight_decay 0 (the quickstart's) timm's optimizer takes exactly torch's SGD steps: the change is free."""
    from vitplast_tune.vit.optim import build_optimizer

    model = _trainable_model("mha+fc2")
    twin = copy.deepcopy(model)
    ours = build_optimizer(FinetuneConfig(lr=0.1), model, torch.device("cpu"))
    plain = torch.optim.SGD([p for p in twin.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    for net, opt in ((model, ours), (twin, plain)):
        for _ in range(3):
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_layer_decay_scales_each_groups_learning_rate():
    """timm's layer-wise decay: lower blocks get smaller learning rates, applied at every step of the schedule."""
    _, reports = run(components="all", layer_decay=0.5, max_steps=8)
    metrics, state = reports[-1]
    groups = state["optimizer"]["param_groups"]
    scales = sorted({g["lr_scale"] for g in groups})
    assert scales[-1] == 1.0 and scales[0] < 0.1  # the head at 1, the embedding 0.5^(depth + 1) below
    for g in groups:
        assert g["lr"] == pytest.approx(metrics["current_lr"] * g["lr_scale"])


def test_evaluate_per_image_gives_one_bit_per_image_in_order():
    """``per_image``: a 0/1 per image, in the batches' order, whose mean is the accuracy (the lab's test_correct)."""
    from vitplast_tune.vit.evaluation import evaluate

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    images, labels = torch.randn(10, 4), torch.randint(0, 3, (10,))
    cpu = {"batch_size": 6, "device": torch.device("cpu")}
    found = evaluate(model, [(images[:6], labels[:6]), (images[6:], labels[6:])], **cpu, per_image=True)
    expected = "".join("1" if hit else "0" for hit in (model(images).argmax(-1) == labels).tolist())
    assert found["correct"] == expected and len(expected) == 10 and 0 < expected.count("1") < 10
    assert found["acc"] == pytest.approx(expected.count("1") / 10)
    assert "correct" not in evaluate(model, [(images, labels)], **cpu)
