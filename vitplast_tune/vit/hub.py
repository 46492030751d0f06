"""Check that a model's pretrained weights are cached, or that their hub answers now, before a run needs them."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

from vitplast_tune import environment
from vitplast_tune.errors import UserError

HUB_TIMEOUT_S = 5.0  # how long a hub's host may take to resolve and accept a connection before its weights are refused
_ON = ("1", "true", "yes", "on")


def _offline() -> bool:
    """Return whether the Hugging Face hub is switched off (``HF_HUB_OFFLINE``)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or (environment.read("HF_HUB_OFFLINE") or "").strip().lower() in _ON


def _hub_url() -> str:
    """Return the Hugging Face hub's address: ``HF_ENDPOINT``, else huggingface_hub's."""
    from huggingface_hub import constants

    return environment.read("HF_ENDPOINT") or constants.ENDPOINT


def _check_reachable(url: str, what: str, fix: str) -> None:
    """Raise UserError unless the host of ``url`` accepts a connection within ``HUB_TIMEOUT_S``."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "huggingface.co", parsed.port or (443 if parsed.scheme == "https" else 80)
    failed = _connect(host, port, HUB_TIMEOUT_S)
    if failed is not None:
        why = getattr(failed, "strerror", None) or str(failed)
        raise UserError(f"{what} {host} cannot be reached ({why}); {fix}")


def _connect(host: str, port: int, timeout: float) -> BaseException | None:
    """Connect to ``host:port`` and close; return the error, or None."""
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    # A thread bounds the name lookup too, which may wait far longer than a socket's timeout.
    thread = threading.Thread(target=attempt, name="vitplast-hub-check", daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else TimeoutError(f"no answer within {timeout:g} s")


def _check_timm_weights(name: str) -> None:
    """Raise UserError unless a timm model's pretrained weights are cached or their hub answers now."""
    import timm

    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None or cfg.file or cfg.state_dict or not (cfg.hf_hub_id or cfg.url):
        return
    fix = "with no network, pass --weights PATH to a local weights file, or download them once with a network"
    if cfg.hf_hub_id:
        from huggingface_hub import constants

        if _in_hf_cache(cfg.hf_hub_id, cfg.hf_hub_filename):
            return
        what = f'the weights of "{name}" ({cfg.hf_hub_id}) are not in the Hugging Face cache {constants.HF_HUB_CACHE}'
        if _offline():
            raise UserError(f"{what} and the hub is off (HF_HUB_OFFLINE); {fix}")
        _check_reachable(_hub_url(), f"{what} and the hub", fix)
        return
    cached = _torch_hub_file(cfg.url)
    if cached.is_file():
        return
    _check_reachable(cfg.url, f'the weights of "{name}" are not in the torch hub cache {cached.parent} and', fix)


def _in_hf_cache(hub_id: str, filename: str | None) -> bool:
    """Return whether the Hugging Face cache holds a weights file timm would load for ``hub_id``."""
    from huggingface_hub import try_to_load_from_cache

    repo, _, revision = hub_id.partition("@")
    names = [filename] if filename else ["model.safetensors", "pytorch_model.bin"]  # timm's safe alternative first
    if filename and filename.endswith(".bin"):
        names.insert(0, filename[: -len(".bin")] + ".safetensors")
    return any(isinstance(try_to_load_from_cache(repo, f, revision=revision or None), str) for f in names)


def _torch_hub_file(url: str) -> Path:
    """Return where torch hub keeps the file downloaded from ``url``."""
    import torch

    return Path(torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(url).path))
