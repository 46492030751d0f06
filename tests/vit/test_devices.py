"""Where a run computes, and in what: the GPU Ray gave it (or a clear failure), its share of that GPU's memory, the
precision its GPU supports, and the device it reports."""

from __future__ import annotations

import pytest
import torch

from vitplast_tune.config import FinetuneConfig
from vitplast_tune.vit import devices, training


def test_outside_ray_a_run_takes_the_default_device():
    assert devices.ray_gpus() is None  # not a Ray task or trial
    assert devices.run_device() == devices.default_device()


def test_a_run_given_a_gpu_it_cannot_see_fails_with_the_reason(monkeypatch):
    monkeypatch.setattr(devices, "ray_gpus", lambda: (1.0, ["0"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(devices.DeviceError, match=r"given 1 GPU \(Ray GPU ids \['0'\]\) but CUDA is not visible"):
        devices.run_device()
    monkeypatch.setattr(devices, "ray_gpus", lambda: (0.0, []))
    assert devices.run_device() == torch.device("cpu")  # given none: the CPU, even where a GPU is visible


def test_a_fraction_of_a_gpu_caps_the_runs_memory(monkeypatch):
    capped = []
    monkeypatch.setattr(devices, "ray_gpus", lambda: (0.5, ["0"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: capped.append((f, d)))
    assert devices.run_device() == torch.device("cuda", 0)
    assert capped == [(0.5, torch.device("cuda", 0))]
    assert devices.memory_fraction(1.0) is None and devices.memory_fraction(0.25) == 0.25


@pytest.mark.parametrize(
    "capability, precision",
    [
        ((7, 0), "fp16"),
        ((7, 5), "fp16"),
        ((8, 0), "bf16"),
        ((8, 6), "bf16"),
        ((9, 0), "bf16"),
    ],  # V100, T4, A100, A10G, H100
)
def test_auto_precision_follows_the_gpus_capability(monkeypatch, capability, precision):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert devices.resolve_precision("auto", torch.device("cuda", 0)) == precision
    assert devices.resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert devices.resolve_precision("fp32", torch.device("cuda", 0)) == "fp32"


def test_a_run_reports_its_device_and_precision():
    _, metrics = training.finetune(
        FinetuneConfig(components="mha", pretrained=False, max_steps=2, eval_every=2, batch_size=8, warmup_steps=1),
        device=torch.device("cpu"),
    )
    assert metrics["device"] == "cpu" and metrics["precision"] == "fp32"
