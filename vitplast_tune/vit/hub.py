"""Whether a model's pretrained weights can be had before a run needs them: from a local cache (Hugging Face's or
torch hub's), or from a hub whose host accepts a connection within seconds; asked once, in the plan, before any of
the download's own retries.

With no network, the weights of a timm tag (``vit_base_patch16_224``) or an ``hf:`` hub id are thus refused in one
line within ``HUB_TIMEOUT_S``; with a network, the real download happens where the model is built, as before.
"""

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


def offline() -> bool:
    """Whether the Hugging Face hub is switched off (``HF_HUB_OFFLINE``, as huggingface_hub reads it or set since)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or (environment.read("HF_HUB_OFFLINE") or "").strip().lower() in _ON


def hub_url() -> str:
    """The Hugging Face hub's address (``HF_ENDPOINT``, else huggingface_hub's)."""
    from huggingface_hub import constants

    return environment.read("HF_ENDPOINT") or constants.ENDPOINT


def check_reachable(url: str, what: str, fix: str) -> None:
    """Check that the host of ``url`` resolves and accepts a connection within ``HUB_TIMEOUT_S``.

    Args:
        url: The address the weights would be fetched from.
        what: The start of the message, the host's name follows (``model "x": the Hugging Face hub``).
        fix: What the user can do instead, for the message.

    Raises:
        UserError: If the host cannot be resolved or reached in time; the message names it, the cause and ``fix``.
    """
    parsed = urlparse(url)
    host, port = parsed.hostname or "huggingface.co", parsed.port or (443 if parsed.scheme == "https" else 80)
    failed = _connect(host, port, HUB_TIMEOUT_S)
    if failed is not None:
        why = getattr(failed, "strerror", None) or str(failed)
        raise UserError(f"{what} {host} cannot be reached ({why}); {fix}")


def _connect(host: str, port: int, timeout: float) -> BaseException | None:
    """Connect to ``host:port`` and close; the error, or None. The lookup is bounded too (a resolver may wait far
    longer than a socket's timeout), by waiting on a daemon thread at most ``timeout`` seconds."""
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=attempt, name="vitplast-hub-check", daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else TimeoutError(f"no answer within {timeout:g} s")


def check_timm_weights(name: str) -> None:
    """Check that the pretrained weights of the timm model ``name`` are cached here or can be downloaded now.

    A tag whose weights are a local file (the testbed) or that has none is left to ``vit.models``; weights on the
    Hugging Face hub are looked for in its cache, weights at a URL in torch hub's.

    Args:
        name: A timm name with an optional tag (``vit_base_patch16_224.augreg_in21k``).

    Raises:
        UserError: If the weights are not cached and the hub is off (``HF_HUB_OFFLINE``) or does not answer within
            ``HUB_TIMEOUT_S``; the message names ``--weights`` and the cache.
    """
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
        if offline():
            raise UserError(f"{what} and the hub is off (HF_HUB_OFFLINE); {fix}")
        check_reachable(hub_url(), f"{what} and the hub", fix)
        return
    cached = _torch_hub_file(cfg.url)
    if cached.is_file():
        return
    check_reachable(cfg.url, f'the weights of "{name}" are not in the torch hub cache {cached.parent} and', fix)


def _in_hf_cache(hub_id: str, filename: str | None) -> bool:
    """Whether the Hugging Face cache holds a weights file timm would load for ``hub_id`` (``repo@revision``)."""
    from huggingface_hub import try_to_load_from_cache

    repo, _, revision = hub_id.partition("@")
    names = [filename] if filename else ["model.safetensors", "pytorch_model.bin"]  # timm's safe alternative first
    if filename and filename.endswith(".bin"):
        names.insert(0, filename[: -len(".bin")] + ".safetensors")
    return any(isinstance(try_to_load_from_cache(repo, f, revision=revision or None), str) for f in names)


def _torch_hub_file(url: str) -> Path:
    """Where torch hub keeps the file downloaded from ``url`` (read, never created)."""
    import torch

    return Path(torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(url).path))
