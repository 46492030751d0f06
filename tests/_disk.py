"""A small disk that fills: a tmpfs of a few MiB mounted for a test (mount needs root: the test is skipped
otherwise), and a file that takes its last byte."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(folder: Path, size_mib: int = 48) -> Iterator[Path]:
    """A tmpfs of ``size_mib`` MiB mounted at ``folder`` (made), unmounted after; the test skipped where mount fails."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to its last byte with one file (returned: unlink it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:  # unbuffered: nothing left to flush when it closes
        try:
            while True:
                f.write(b"\0" * 2**16)
        except OSError:
            pass
    return filler
