"""The driver's files sent to other nodes through Ray's object store and unpacked once per node; dataset downloads
that trials on one node do not race."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from vitplast_tune.config import FinetuneConfig, cache_dir
from vitplast_tune.data import datasets, image_files, staging


def tree(root: Path) -> Path:
    for split, count in (("train", 3), ("test", 2)):
        for c in ("cat", "dog"):
            (root / split / c).mkdir(parents=True)
            for i in range(count):
                (root / split / c / f"{i}.png").write_bytes(bytes([i]) * (10 + i))
    (root / "train" / "download.tar.gz").write_bytes(b"archive")  # a download torchvision extracted already
    (root / "other").mkdir()
    (root / "other" / "x.bin").write_bytes(b"not read by imagefolder")
    return root


def test_the_files_a_search_reads_from_the_drivers_disk(tmp_path):
    tree(tmp_path / "images")
    (tmp_path / "w.safetensors").write_bytes(b"w" * 7)
    cfg = FinetuneConfig(
        dataset="imagefolder", data_dir=str(tmp_path / "images"), weights=str(tmp_path / "w.safetensors")
    )
    weights, data = staging.needed(cfg)
    assert (weights.role, weights.root, weights.paths, weights.nbytes) == (
        "weights",
        str(tmp_path),
        ("w.safetensors",),
        7,
    )
    assert data.role == "data" and data.root == str(tmp_path / "images") and len(data.paths) == 10
    assert all(p.startswith(("train/", "test/")) and not p.endswith(".tar.gz") for p in data.paths)
    assert staging.present(data) and staging.present(weights)
    (tmp_path / "images" / "test" / "dog" / "0.png").write_bytes(b"changed size")
    assert not staging.present(data)
    assert staging.needed(FinetuneConfig()) == []  # digits and the shipped weights: nothing on the driver's disk
    reference = staging.needed(FinetuneConfig(data_dir=str(tmp_path / "images")), reference="imagefolder")
    assert [f.role for f in reference] == ["data"]  # a plasticity reference read from files


def test_staged_files_are_unpacked_once_per_node_and_the_run_points_at_them(ray_local, tmp_path, monkeypatch):
    tree(tmp_path / "images")
    (tmp_path / "w.safetensors").write_bytes(b"w" * 7)
    cfg = FinetuneConfig(
        dataset="imagefolder", data_dir=str(tmp_path / "images"), weights=str(tmp_path / "w.safetensors"), download=True
    )
    monkeypatch.setattr(staging, "PART_BYTES", 64)  # several parts
    staged = staging.stage(staging.needed(cfg))
    assert all(len(s.parts) > 1 for s in staged)
    unpacked = []
    real = staging._unpack
    monkeypatch.setattr(staging, "_unpack", lambda s, d: (unpacked.append(d), time.sleep(0.5), real(s, d)))
    results = []
    threads = [threading.Thread(target=lambda: results.append(staging.localize(cfg, staged))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(unpacked) == 2 and len(results) == 3 and len({(r.data_dir, r.weights) for r in results}) == 1
    local = results[0]
    assert Path(local.data_dir).parent == cache_dir() / "staged" and not local.download
    assert Path(local.weights).read_bytes() == b"w" * 7
    assert image_files.imagefolder_classes(Path(local.data_dir)) == ["cat", "dog"]
    assert sorted(str(p.relative_to(local.data_dir)) for p in Path(local.data_dir).rglob("*.png")) == sorted(
        staged[1].files.paths
    )
    assert staging.localize(cfg, []) is cfg


def test_trials_sharing_a_node_do_not_race_a_download(tmp_path, monkeypatch):
    import torchvision.datasets

    running, overlaps = [0], []

    class Fake:
        def __init__(self, root, train, download):
            running[0] += 1
            overlaps.append(running[0])
            time.sleep(0.3)
            self.data = __import__("numpy").zeros((1, 32, 32, 3), "uint8")
            self.targets = [0]
            running[0] -= 1

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", Fake)
    load = lambda: datasets._load("cifar10", {}, tmp_path / "data", True, 0, 0.2)
    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(overlaps) == 6 and max(overlaps) == 1  # one download at a time
    assert (tmp_path / "data" / ".cifar10.download.lock").exists()


def test_no_lock_without_a_download(tmp_path):
    with image_files.download_lock(tmp_path / "data", "cifar10", False):
        assert not (tmp_path / "data").exists()
