"""Where a run computes: the device Ray gave a trial or task (a GPU, its memory capped to the fraction given, or the
CPU), the device a user names, and the precision a run uses there."""

from __future__ import annotations

from typing import Any

import torch

from vitplast_tune import environment
from vitplast_tune._compat import ray as ray_internals
from vitplast_tune.errors import UserError


class DeviceError(RuntimeError):
    """A run was given GPUs that torch cannot use (no CUDA visible): it stops instead of training on the CPU."""


def default_device() -> torch.device:
    """CUDA when there is a GPU, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_device() -> torch.device:
    """Find the device a run computes on.

    In a Ray task or trial this is the GPU Ray gave it, its memory capped to the fraction given
    (``--gpus-per-trial 0.5``: half), or the CPU when it was given no GPU. Outside Ray, ``default_device()``.

    Returns:
        The device.

    Raises:
        DeviceError: If Ray gave the run a GPU but CUDA is not visible to torch.
    """
    given = ray_gpus()
    if given is None:
        return default_device()
    amount, ids = given
    if not amount:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceError(
            f"this run was given {amount:g} GPU (Ray GPU ids {ids}) but CUDA is not visible to torch {torch.__version__} "
            f"(built for CUDA {torch.version.cuda}; CUDA_VISIBLE_DEVICES={environment.read('CUDA_VISIBLE_DEVICES')!r}): "
            "check the node's NVIDIA driver and that torch is a CUDA build; not training on the CPU instead"
        )
    device = torch.device("cuda", 0)  # Ray sets CUDA_VISIBLE_DEVICES to the GPU it gave
    if (fraction := memory_fraction(amount)) is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    return device


def ray_gpus() -> tuple[float, list[str]] | None:
    """(GPUs, their ids) that Ray gave the task or actor running this; None outside a Ray worker."""
    if not ray_internals.in_worker():
        return None
    import ray

    context = ray.get_runtime_context()
    return float(context.get_assigned_resources().get("GPU", 0.0)), list(context.get_accelerator_ids().get("GPU", []))


def memory_fraction(gpus: float) -> float | None:
    """The share of a GPU's memory a run given ``gpus`` of it may take (None: a whole GPU, no cap)."""
    return gpus if 0 < gpus < 1 else None


def device_name(device: torch.device) -> str:
    """``cpu``, or ``cuda:0 NVIDIA H100 80GB HBM3`` (the GPU's name): what a trial reports and MLflow tags."""
    if device.type != "cuda":
        return device.type
    device = indexed(device)
    return f"{device} {torch.cuda.get_device_name(device)}"


def indexed(device: torch.device) -> torch.device:
    """``device`` with its index: plain ``cuda`` is the current GPU (``cuda:0`` unless set), as torch computes on it."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def task_device() -> str:
    """The name of the device that a Ray task or trial calling this computes on (``run_device``), for checks."""
    return device_name(run_device())


def device_facts(device: torch.device) -> dict[str, Any]:
    """What a run reports about where it computes: ``device`` (``device_name``) and, on a GPU, the cap on its share
    of the GPU's memory (``gpu_memory_fraction``, 1.0 for none; where this torch can tell)."""
    facts: dict[str, Any] = {"device": device_name(device)}
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if device.type == "cuda" and fraction is not None:
        facts["gpu_memory_fraction"] = fraction(indexed(device))  # which asks for an index
    return facts


def resolve_precision(precision: str, device: torch.device) -> str:
    """Resolve the precision a run uses on a device.

    Args:
        precision: The precision asked for: ``auto``, or an explicit choice (``fp32``, ``bf16``, ``fp16``), which
            stands; on the CPU, bf16 and fp16 run under CPU autocast, for checks.
        device: The run's device.

    Returns:
        The precision: for ``auto``, bf16 where the CUDA device supports it, else fp16 on CUDA (with a gradient
        scaler), fp32 elsewhere.
    """
    if precision != "auto":
        return precision
    if device.type != "cuda":
        return "fp32"
    major, _ = torch.cuda.get_device_capability(device)
    return "bf16" if major >= 8 else "fp16"  # bf16 computes natively from compute capability 8.0 (A100, A10G, L4, H100)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Turn a device a user names into a torch device.

    Args:
        device: The name or device (None: CUDA when there is a GPU, else the CPU).

    Returns:
        The device.

    Raises:
        UserError: If torch does not know the name, or this machine does not have that CUDA device.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise UserError(f'invalid device "{device}": {exc}') from exc
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UserError(f'device "{device}": no CUDA GPU is visible here; use --device cpu, or leave --device out')
        if resolved.index is not None and resolved.index >= count:
            raise UserError(f'device "{device}": this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}')
    return resolved
