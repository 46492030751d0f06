"""Find where a run computes and in what precision."""

from __future__ import annotations

from typing import Any

import torch

from vitplast_tune import environment
from vitplast_tune._compat import ray as ray_internals
from vitplast_tune.errors import UserError


class DeviceError(RuntimeError):
    """A run got GPUs that torch cannot use; it stops rather than train on the CPU."""


def default_device() -> torch.device:
    """Return CUDA when there is a GPU, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_device() -> torch.device:
    """Find the device a run computes on; DeviceError when Ray gave a GPU that torch cannot see.

    In Ray it is the GPU Ray gave, its memory capped to the fraction given, or the CPU. Outside Ray it is
    ``default_device()``.
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
    """Return the GPUs Ray gave the task or actor running this, and their ids; None outside a Ray worker."""
    if not ray_internals.in_worker():
        return None
    import ray

    context = ray.get_runtime_context()
    return float(context.get_assigned_resources().get("GPU", 0.0)), list(context.get_accelerator_ids().get("GPU", []))


def memory_fraction(gpus: float) -> float | None:
    """Return the share of a GPU's memory a run given ``gpus`` may take; None for a whole GPU."""
    return gpus if 0 < gpus < 1 else None


def device_name(device: torch.device) -> str:
    """Name a device as a trial reports it: ``cpu``, or ``cuda:0 NVIDIA H100 80GB HBM3``."""
    if device.type != "cuda":
        return device.type
    device = indexed(device)
    return f"{device} {torch.cuda.get_device_name(device)}"


def indexed(device: torch.device) -> torch.device:
    """Return ``device`` with its index; plain ``cuda`` is the current GPU."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def task_device() -> str:
    """Name the device of the Ray task or trial that calls this."""
    return device_name(run_device())


def device_facts(device: torch.device) -> dict[str, Any]:
    """Return the device's name and, on a GPU, the cap on its memory share (``gpu_memory_fraction``)."""
    facts: dict[str, Any] = {"device": device_name(device)}
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if device.type == "cuda" and fraction is not None:
        facts["gpu_memory_fraction"] = fraction(indexed(device))  # it needs an indexed device
    return facts


def resolve_precision(precision: str, device: torch.device) -> str:
    """Resolve the precision a run uses on a device.

    Args:
        precision: ``auto``, or fp32, bf16 or fp16, which stands; on the CPU, bf16 and fp16 run under autocast.
        device: The run's device.

    Returns:
        For ``auto``: bf16 where the GPU supports it, else fp16 on CUDA and fp32 elsewhere.
    """
    if precision != "auto":
        return precision
    if device.type != "cuda":
        return "fp32"
    major, _ = torch.cuda.get_device_capability(device)
    return "bf16" if major >= 8 else "fp16"  # native bf16 from compute capability 8.0


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Turn a device a user names into a torch device.

    Args:
        device: The name or device (None: ``default_device()``).

    Returns:
        The device.

    Raises:
        UserError: torch does not know the name, or this machine lacks that CUDA device.
    """
    if device is None:
        return default_device()
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
