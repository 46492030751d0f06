"""Send files on the driver's disk (a file dataset's folders, a weights file) to nodes that lack them.

The files travel through Ray's object store as a tar archive in parts and are unpacked once per node. Torch-free:
the driver uses it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vitplast_tune.config import FinetuneConfig, cache_dir, default_data_dir

LIMIT_BYTES = 4 * 2**30  # the most a search sends; more is refused
PART_BYTES = 256 * 2**20  # the archive travels in parts of this size
# The folders under --data-dir that a file dataset reads (torchvision's names for pets and flowers102).
FOLDERS = {"imagefolder": ("train", "test"), "pets": ("oxford-iiit-pet",), "flowers102": ("flowers-102",)}
ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")  # downloads torchvision has already extracted beside them


@dataclass(frozen=True)
class Files:
    """Files a run reads from the driver's disk, a dataset's root or a weights file, named by a digest ``key``."""

    role: str
    root: str
    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    key: str

    @property
    def nbytes(self) -> int:
        """Bytes of every file."""
        return sum(self.sizes)

    def describe(self) -> str:
        """Say what these files are, with their count and size, for messages."""
        what = f"weights file {Path(self.root, self.paths[0])}" if self.role == "weights" else f"dataset {self.root}"
        return f"{what} ({len(self.paths)} files, {self.nbytes / 2**20:.1f} MiB)"


@dataclass
class Staged:
    """``Files`` sent through the object store as a tar archive in ``parts``, Ray object refs in order."""

    files: Files
    parts: list[Any] = field(default_factory=list)


def needed(settings: FinetuneConfig, reference: str | None = None) -> list[Files]:
    """List the files on the driver's disk that runs of ``settings`` read: a weights file, a file dataset's folders."""
    found = []
    if settings.weights is not None:
        path = Path(settings.weights).expanduser().resolve()
        found.append(_files("weights", path.parent, [path]))
    folders = sorted({f for name in (settings.dataset, reference) if name for f in FOLDERS.get(name, ())})
    if folders:
        root = Path(settings.data_dir).expanduser().resolve() if settings.data_dir else default_data_dir()
        paths = [
            p
            for folder in folders
            for p in sorted((root / folder).rglob("*"))
            if p.is_file() and not p.name.endswith(ARCHIVES)
        ]
        if paths:
            found.append(_files("data", root, paths))
    return found


def _files(role: str, root: Path, paths: list[Path]) -> Files:
    relative = tuple(str(p.relative_to(root)) for p in paths)
    sizes = tuple(p.stat().st_size for p in paths)
    digest = hashlib.sha256(f"{role}|{root}".encode())
    for path, size, mtime in zip(relative, sizes, (p.stat().st_mtime_ns for p in paths)):
        digest.update(f"|{path}|{size}|{mtime}".encode())
    return Files(role, str(root), relative, sizes, digest.hexdigest()[:16])


def present(files: Files) -> bool:
    """Return whether this machine has ``files`` where the driver has them, each of the same size."""
    root = Path(files.root)
    try:
        return all((root / p).stat().st_size == size for p, size in zip(files.paths, files.sizes))
    except OSError:
        return False


def stage(files: Sequence[Files]) -> list[Staged]:
    """Put each set of files in Ray's object store as a tar archive in parts, on the driver."""
    import numpy as np
    import ray

    staged = []
    for f in files:
        with tempfile.TemporaryFile() as archive:
            with tarfile.open(fileobj=archive, mode="w") as tar:
                for path in f.paths:
                    tar.add(Path(f.root, path), arcname=path, recursive=False)
            archive.seek(0)
            parts = []
            while chunk := archive.read(PART_BYTES):
                parts.append(ray.put(np.frombuffer(chunk, dtype=np.uint8)))
        staged.append(Staged(f, parts))
    return staged


def localize(cfg: FinetuneConfig, staged: Sequence[Staged]) -> FinetuneConfig:
    """Point a run's settings at this node's copies of the staged files; a staged dataset turns ``download`` off."""

    paths = local_paths(staged)
    if not paths:
        return cfg
    changes: dict[str, Any] = {k: v for k, v in paths.items() if k in ("weights", "data_dir")}
    return replace(cfg, **changes, download=cfg.download and "data_dir" not in changes)


def local_paths(staged: Sequence[Staged]) -> dict[str, str]:
    """Return this node's copies of the weights file and data folder, unpacked first where missing."""
    out = {}
    for s in staged:
        root = _node_copy(s)
        if s.files.role == "weights":
            out["weights"] = str(root / s.files.paths[0])
        else:
            out["data_dir"] = str(root)
    return out


def _node_copy(staged: Staged) -> Path:
    """Return this node's copy of ``staged``, unpacked once per node under a file lock, written beside and renamed."""
    from filelock import FileLock

    directory = cache_dir() / "staged" / staged.files.key
    if present(replace(staged.files, root=str(directory))):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{directory}.lock"):
        if not present(replace(staged.files, root=str(directory))):
            _unpack(staged, directory)
    return directory


def _unpack(staged: Staged, directory: Path) -> None:
    import ray

    partial = directory.with_name(f"{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)  # an incomplete copy
    with tempfile.TemporaryFile(dir=directory.parent) as archive:
        for ref in staged.parts:
            archive.write(memoryview(ray.get(ref)))  # hold one part at a time
        archive.seek(0)
        with tarfile.open(fileobj=archive, mode="r") as tar:
            tar.extractall(partial, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    os.replace(partial, directory)
