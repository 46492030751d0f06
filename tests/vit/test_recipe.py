"""The recipe's settings: each refused with one line when it cannot train, each changing what it should, and nothing
when it is off (gradient accumulation, label smoothing, mixup and cutmix, the EMA of the weights, drop_path,
RandAugment / AutoAugment)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _families import build

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.data import datasets, transforms
from vitplast_tune.data.splits import SmallImages
from vitplast_tune.errors import UserError
from vitplast_tune.run.checkpoints import read_checkpoint, write_checkpoint
from vitplast_tune.vit import methods, models, recipe, training

BASE = dict(
    model="vit_testbed_patch8_32",
    pretrained=False,
    components="mha+fc2",
    augment="none",  # no random crops: batches that hold the same images are the same tensors
    precision="fp32",
    lr=0.05,
    warmup_steps=1,
    threads=1,
    eval_test=False,
)


def trained(**settings):
    """(final metrics, every report's (metrics, state)) of a finetuning run of ``BASE`` with ``settings``."""
    reports = []
    cfg = FinetuneConfig(**{**BASE, **settings})
    model, metrics = training.finetune(cfg, report=lambda m, s: reports.append((m, copy.deepcopy(s))))
    return cfg, model, metrics, reports


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(grad_accum_steps=0), "grad_accum_steps must be at least 1, got 0"),
        (dict(label_smoothing=1.0), r"label_smoothing must lie in \[0, 1\), got 1.0"),
        (dict(mixup=-0.2), "mixup \\(its Beta alpha\\) must not be negative"),
        (dict(cutmix=0.5, batch_size=33), "mixup and cutmix pair each image with another: batch_size must be even"),
        (dict(mixup_prob=1.5), r"mixup_prob must lie in \[0, 1\]"),
        (dict(ema_decay=1.0), r"ema_decay must lie in \(0, 1\)"),
        (dict(drop_path=-0.1), r"drop_path must lie in \[0, 1\)"),
        (dict(auto_augment="randd-m9"), 'unknown auto_augment policy "randd-m9" \\(did you mean "rand"'),
        (dict(grad_accum_steps=1.5), "grad_accum_steps must be an integer"),
    ],
)
def test_each_setting_is_refused_in_one_line_when_it_cannot_train(settings, message):
    with pytest.raises(UserError, match=message) as caught:
        FinetuneConfig(**settings).validate()
    assert "\n" not in str(caught.value)


def test_what_only_timm_or_the_family_can_check_is_refused_in_one_line(tmp_path):
    from _families import hf_folder

    with pytest.raises(UserError, match='auto_augment "rand-zz9" is not a policy timm understands'):
        recipe.check(FinetuneConfig(auto_augment="rand-zz9"))
    with pytest.raises(UserError, match="hf-vit models have no stochastic depth"):
        recipe.check(FinetuneConfig(model=hf_folder(tmp_path, "hf-vit"), drop_path=0.1))
    recipe.check(FinetuneConfig(model=hf_folder(tmp_path, "hf-dinov2"), drop_path=0.1))  # DINOv2 has it
    with pytest.raises(UserError, match="needs a training crop: augment paper or light, not none"):
        transforms.with_auto_augment("none", "rand-m9-mstd0.5")


def test_accumulating_two_batches_of_8_steps_as_one_batch_of_16():
    steps = dict(max_steps=3, eval_every=3, grad_clip=0.0)  # no clipping, which would hide a gradient's scale
    _, _, one, [(_, state_16)] = trained(batch_size=16, **steps)
    _, _, two, [(_, state_8x2)] = trained(batch_size=8, grad_accum_steps=2, **steps)
    _, _, _, [(_, state_8)] = trained(batch_size=8, **steps)
    for name, tensor in state_16["trainable"].items():
        torch.testing.assert_close(state_8x2["trainable"][name], tensor, rtol=1e-5, atol=1e-6)
    assert one["train_loss"] == pytest.approx(two["train_loss"], rel=1e-5)
    assert two["images_per_s"] == pytest.approx(two["steps_per_s"] * 16)  # the effective batch
    moved = [not torch.allclose(state_8["trainable"][n], t, atol=1e-6) for n, t in state_16["trainable"].items()]
    assert any(moved), "batch 8 without accumulation steps as batch 16 does: the comparison cannot fail"


def test_label_smoothing_is_timms_smoothed_cross_entropy_and_nothing_when_off():
    logits, labels = torch.randn(6, 10, generator=torch.Generator().manual_seed(0)), torch.arange(6)
    smooth = recipe.training_loss(FinetuneConfig(label_smoothing=0.1), 10)
    plain = recipe.training_loss(FinetuneConfig(), 10)
    assert smooth.mixup is None and plain.criterion is None
    torch.testing.assert_close(smooth(logits, labels), F.cross_entropy(logits, labels, label_smoothing=0.1))
    torch.testing.assert_close(plain(logits, labels), F.cross_entropy(logits, labels))
    assert not torch.allclose(smooth(logits, labels), plain(logits, labels))
    _, _, off, _ = trained(batch_size=16, max_steps=2, eval_every=2)
    _, _, on, _ = trained(batch_size=16, max_steps=2, eval_every=2, label_smoothing=0.3)
    assert on["train_loss"] != pytest.approx(off["train_loss"], rel=1e-3)


@pytest.mark.parametrize("setting", [dict(mixup=0.8), dict(cutmix=1.0), dict(mixup=0.8, cutmix=1.0)])
def test_mixup_and_cutmix_mix_the_batch_into_soft_targets_from_a_seed(setting):
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(8) % 4
    loss = recipe.training_loss(FinetuneConfig(**setting, label_smoothing=0.1), 4)
    mixed, soft = loss.targets(images.clone(), labels, seed=5)
    again, soft_again = loss.targets(images.clone(), labels, seed=5)
    assert torch.equal(mixed, again) and torch.equal(soft, soft_again)  # a seed per batch: resumable
    assert soft.shape == (8, 4) and torch.allclose(soft.sum(1), torch.ones(8))
    assert not torch.equal(mixed, images) and (soft > 0).sum(1).min() >= 2  # mixed images, two labels each
    if setting.get("cutmix") and not setting.get("mixup"):
        assert (mixed == images).float().mean() > 0.2  # cutmix pastes patches: the rest of each image is its own
    plain = recipe.training_loss(FinetuneConfig(), 4)
    same, hard = plain.targets(images, labels, seed=5)
    assert same is images and hard is labels  # off: nothing mixed
    assert np.isfinite(trained(batch_size=16, max_steps=2, eval_every=2, **setting)[2]["train_loss"])


EMA_RUN = dict(model="vit_testbed_patch8_32.fractal", pretrained=True, components="fc1+fc2", lr=0.3, batch_size=32)


def test_the_ema_is_evaluated_and_is_what_the_best_checkpoint_holds(tmp_path):
    """The pretrained testbed learns digits within a few steps, so the EMA (decay 0.9) lags the weights by points of
    accuracy: what is reported, kept and tested must be the EMA's."""
    cfg, model, metrics, reports = trained(**EMA_RUN, max_steps=12, eval_every=4, ema_decay=0.9, eval_test=True)
    _, splits = training.build_run(cfg)

    def val_acc(tensors):
        return training.evaluate(
            methods.plain_model(cfg, tensors), splits.val, batch_size=32, device=torch.device("cpu")
        )["acc"]

    for reported, state in reports[:-1]:  # the last state's weights are the best ones put back
        assert set(state["ema"]) == set(state["trainable"])
        assert reported["val_acc"] == pytest.approx(val_acc(state["ema"]))  # the EMA is what is scored
    first = reports[0]
    assert val_acc(first[1]["trainable"]) != pytest.approx(first[0]["val_acc"])  # not the weights themselves
    best_state = next(s for m, s in reports if m["step"] == metrics["best_step"])
    kept = reports[-1][1]["best"]["trainable"]
    assert all(torch.equal(kept[n], t) for n, t in best_state["ema"].items())  # the best kept: the EMA at its step
    assert val_acc(kept) == pytest.approx(metrics["best_val_acc"])
    write_checkpoint(tmp_path, reports[-1][1])
    assert set(read_checkpoint(_Checkpoint(tmp_path))["ema"]) == set(kept)
    _, _, _, plain = trained(batch_size=16, max_steps=2, eval_every=2)
    assert "ema" not in plain[-1][1]


def test_a_run_with_an_ema_resumes_where_it_stopped():
    settings = dict(**EMA_RUN, max_steps=8, eval_every=4, ema_decay=0.7)
    _, _, whole, reports = trained(**settings)
    cfg = FinetuneConfig(**{**BASE, **settings})
    states = []
    training.finetune(cfg, resume=copy.deepcopy(reports[0][1]), report=lambda m, s: states.append(copy.deepcopy(s)))
    for name, tensor in reports[-1][1]["ema"].items():
        torch.testing.assert_close(states[-1]["ema"][name], tensor, rtol=0, atol=1e-6)


class _Checkpoint:
    """A folder as Tune's checkpoint (``as_directory``)."""

    def __init__(self, path):
        self.path = path

    def as_directory(self):
        import contextlib

        return contextlib.nullcontext(str(self.path))


def test_drop_path_makes_training_forward_passes_stochastic_and_nothing_when_off(tmp_path):
    x = torch.randn(2, 3, 32, 32)
    for rate, stochastic in ((0.3, True), (0.0, False)):
        torch.manual_seed(0)
        model = models.create_model("eva02_testbed_patch8_32", 3, pretrained=False, drop_path_rate=rate).train()
        with torch.no_grad():
            assert torch.equal(model(x), model(x)) is not stochastic
            assert torch.equal(model.eval()(x), model(x))  # evaluation keeps every block
    from _families import hf_folder

    dinov2 = models.create_model(hf_folder(tmp_path, "hf-dinov2"), 3, pretrained=False, drop_path_rate=0.2)
    assert dinov2.model.config.drop_path_rate == 0.2
    cfg = FinetuneConfig(**{**BASE, "drop_path": 0.25})
    assert training.create_run_model(cfg).blocks[-1].drop_path1.drop_prob == pytest.approx(0.25)


def test_randaugment_varies_the_training_images_per_seed_and_leaves_evaluation_alone():
    decoded = datasets.decode_dataset("digits", models.pretrained_data_config("vit_testbed_patch8_32"))
    config = models.pretrained_data_config("vit_testbed_patch8_32")
    idx = np.arange(16)
    policy = transforms.with_auto_augment("light", "rand-m9-mstd0.5")
    assert policy == "light+rand-m9-mstd0.5" and transforms.augmentation(policy).auto_augment == "rand-m9-mstd0.5"
    light = SmallImages(decoded.images, decoded.labels, idx, config, True, "light")
    rand = SmallImages(decoded.images, decoded.labels, idx, config, True, policy)
    cpu = torch.device("cpu")
    a, b = rand.batch(np.arange(16), cpu, seed=3)[0], rand.batch(np.arange(16), cpu, seed=3)[0]
    assert torch.equal(a, b)  # seeded per batch: a resumed run replays it
    assert not torch.equal(a, rand.batch(np.arange(16), cpu, seed=4)[0])
    with transforms.seeded(3):
        plain = torch.stack([light.transform(_pil(decoded.images[j])) for j in idx])
    assert not torch.equal(a, plain)  # the policy changes the images the recipe alone makes
    assert "RandAugment" in repr(rand.transform) and "RandAugment" not in repr(light.transform)
    evaluation = SmallImages(decoded.images, decoded.labels, idx, config, False, policy)
    plain_eval = SmallImages(decoded.images, decoded.labels, idx, config, False, "light")
    assert torch.equal(evaluation.batch(np.arange(16), cpu)[0], plain_eval.batch(np.arange(16), cpu)[0])
    assert np.isfinite(
        trained(batch_size=16, max_steps=2, eval_every=2, augment="light", auto_augment="rand-m9")[2]["train_loss"]
    )


def _pil(image):
    from vitplast_tune.data.splits import _pil as pil

    return pil(image)


def test_the_shipped_settings_change_nothing(tmp_path):
    """Every recipe setting at its default: the same run as before they existed (plain cross-entropy, no EMA)."""
    cfg = FinetuneConfig()
    assert (cfg.grad_accum_steps, cfg.label_smoothing, cfg.mixup, cfg.cutmix, cfg.drop_path) == (1, 0.0, 0.0, 0.0, 0.0)
    assert cfg.ema_decay is None and cfg.auto_augment is None
    loss = recipe.training_loss(cfg, 10)
    assert loss.mixup is None and loss.criterion is None and recipe.weight_average(cfg, build("vit", tmp_path)) is None


@pytest.mark.parametrize("setting", [dict(components="head"), dict(compile=True)])
def test_the_ema_is_scored_through_the_runs_own_path_probe_or_compiled(setting, monkeypatch):
    """A linear probe scores the EMA's head on the cached features; a compiled run scores the EMA on images."""
    monkeypatch.setattr(torch, "compile", lambda module: lambda images: module(images))  # a stand-in: no inductor
    cfg, _, metrics, reports = trained(**{**EMA_RUN, **setting}, max_steps=4, eval_every=2, ema_decay=0.5)
    _, splits = training.build_run(cfg)
    rebuilt = methods.plain_model(cfg, reports[0][1]["ema"])
    assert reports[0][0]["val_acc"] == pytest.approx(
        training.evaluate(rebuilt, splits.val, batch_size=32, device=torch.device("cpu"))["acc"]
    )
