"""The one-time decode of JPEG datasets into a resized uint8 cache (image_cache.py), through the real loaders."""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitplast_tune.data import datasets, image_cache
from vitplast_tune.data.batches import loader
from vitplast_tune.errors import UserError
from vitplast_tune.vit import models

ROOT = Path(__file__).resolve().parents[2]
CONFIG = models.pretrained_data_config("vit_testbed_patch8_32")  # 32 px


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setattr(image_cache, "cache_root", lambda: root)
    return root


def smooth_image(path: Path, seed: int, size=(120, 90)) -> None:
    """A smooth random RGB image (a blurred gradient), so that resizing it twice or once differs little."""
    rng = np.random.default_rng(seed)
    width, height = size
    y, x = np.mgrid[0:height, 0:width] / max(size)
    channels = [np.sin(6 * x * rng.uniform(0.5, 1.5) + rng.uniform(0, 6)) * np.cos(5 * y + c) for c in range(3)]
    pixels = ((np.stack(channels, -1) + 1) * 127.5).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, quality=95)


def folder(root: Path, sizes=((120, 90), (90, 120), (20, 24))) -> Path:
    for c, cls in enumerate(("cat", "dog")):
        for i, size in enumerate(sizes):
            smooth_image(root / "train" / cls / f"{i}.jpg", 10 * c + i, size)
            smooth_image(root / "test" / cls / f"{i}.jpg", 100 + 10 * c + i, size)
    return root


def test_cached_folder_gives_the_same_splits_and_nearly_the_same_images(tmp_path, cache_root):
    root = folder(tmp_path / "data")
    plain = datasets.load_dataset("imagefolder", CONFIG, data_dir=root, seed=3, val_fraction=0.4)
    cached = datasets.load_dataset("imagefolder", CONFIG, data_dir=root, seed=3, val_fraction=0.4, image_cache=48)
    assert [len(s) for s in (cached.train, cached.val, cached.test)] == [
        len(s) for s in (plain.train, plain.val, plain.test)
    ]
    assert cached.num_classes == plain.num_classes == 2
    assert list(cached.val.indices) == list(plain.val.indices)
    for a, b in ((cached.val, plain.val), (cached.test, plain.test)):  # the evaluation transform is deterministic
        for i in range(len(a)):
            (x, label), (y, expected) = a[i], b[i]
            assert label == expected and x.shape == y.shape == (3, 32, 32)
            assert (x - y).abs().mean() < 0.05  # resized once (128 -> 32) or twice (128 -> 48 -> 32)
    directories = sorted(p.name for p in cache_root.iterdir() if p.is_dir())
    assert [d.split("__")[:2] for d in directories] == [["imagefolder-test", "48px"], ["imagefolder-train", "48px"]]


def test_the_cache_holds_shorter_sides_resized_and_small_images_as_they_are(tmp_path, cache_root):
    root = folder(tmp_path / "data")
    from torchvision.datasets import ImageFolder

    source = ImageFolder(str(root / "train"))
    directory = image_cache.ensure(lambda: source, "folder", 48)
    cached = image_cache.CachedImages(directory)
    assert len(cached) == len(source) == 6
    shapes = [np.asarray(cached[i][0]).shape for i in range(len(cached))]
    assert shapes == [(48, 64, 3), (64, 48, 3), (24, 20, 3)] * 2  # 120x90 -> 64x48, 90x120 -> 48x64, 20x24 kept
    assert [cached[i][1] for i in range(6)] == source.targets
    small = 2  # the 20x24 image is smaller than 48 px: stored as decoded
    assert np.array_equal(np.asarray(cached[small][0]), np.asarray(source[small][0]))
    assert len(pickle.dumps(cached)) < 10_000  # DataLoader workers get the index, not the pixels
    batches = loader(image_cache.CachedImages(directory, lambda im: torch.tensor(im.size)), 3, 2, torch.device("cpu"))
    assert sorted(tuple(size) for images, _ in batches for size in images.tolist()) == sorted(
        [(64, 48), (48, 64), (20, 24)] * 2
    )


def test_built_once_and_again_only_when_a_file_changes(tmp_path, cache_root, monkeypatch):
    root = folder(tmp_path / "data")
    builds = []
    build = image_cache._build
    monkeypatch.setattr(image_cache, "_build", lambda *args: builds.append(args[1]) or build(*args))
    for _ in range(2):
        datasets.load_dataset("imagefolder", CONFIG, data_dir=root, image_cache=48)
    assert len(builds) == 2  # train and test, once
    smooth_image(root / "train" / "cat" / "0.jpg", 999, (120, 90))
    os.utime(root / "train" / "cat" / "0.jpg", ns=(1, 1))  # a changed file, whatever the clock's resolution
    datasets.load_dataset("imagefolder", CONFIG, data_dir=root, image_cache=48)
    assert len(builds) == 3 and "imagefolder-train" in builds[-1].name and builds[-1] not in builds[:2]


def test_a_killed_build_leaves_nothing_half_written(tmp_path, cache_root):
    root = folder(tmp_path / "data")
    from torchvision.datasets import ImageFolder

    class Breaks(ImageFolder):
        def __getitem__(self, i):
            if i == 3:
                raise KeyboardInterrupt
            return super().__getitem__(i)

    with pytest.raises(KeyboardInterrupt):
        image_cache.ensure(lambda: Breaks(str(root / "train")), "folder", 48)
    assert not [p for p in cache_root.iterdir() if p.is_dir() and (p / image_cache.INDEX).exists()]
    directory = image_cache.ensure(lambda: ImageFolder(str(root / "train")), "folder", 48)
    assert len(image_cache.CachedImages(directory)) == 6


@pytest.mark.slow  # a child process or a server of its own
def test_two_processes_on_one_node_build_it_once(tmp_path):
    root = folder(tmp_path / "data")
    script = (
        "import sys; from pathlib import Path; from torchvision.datasets import ImageFolder; "
        "from vitplast_tune.data import image_cache; "
        f"image_cache.ensure(lambda: ImageFolder({str(root / 'train')!r}), 'folder', 48, root={str(tmp_path / 'c')!r})"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    said = [p.communicate(timeout=120)[1] for p in procs]  # the library's log, on standard error
    assert [p.returncode for p in procs] == [0, 0], said
    assert sum(s.count("decoded 6 images of folder") for s in said) == 1
    assert len([p for p in (tmp_path / "c").iterdir() if p.is_dir()]) == 1  # and no partial directory left


def test_a_trial_trains_from_the_cache(tmp_path, cache_root):
    from vitplast_tune.vit.training import FinetuneConfig, finetune

    root = folder(tmp_path / "data")
    cfg = FinetuneConfig(
        model="vit_testbed_patch8_32", pretrained=False, dataset="imagefolder", data_dir=str(root), image_cache=40,
        components="mha", max_steps=4, eval_every=2, batch_size=2, threads=1, num_workers=1, val_fraction=0.4,
    )  # fmt: skip
    _, metrics = finetune(cfg)
    assert metrics["step"] == 4 and 0 <= metrics["test_acc"] <= 1
    assert len([p for p in cache_root.iterdir() if p.is_dir()]) == 2


def test_a_cache_smaller_than_the_model_input_is_refused_before_anything_starts(tmp_path, cache_root):
    from vitplast_tune.plan import SearchOptions, prepare

    root = folder(tmp_path / "data")
    space = tmp_path / "s.yaml"
    space.write_text(
        "metric: val_acc\nmode: max\nalgorithm: grid\nparameters: {components: mha}\n"
        "defaults: {dataset: imagefolder, pretrained: false, image_cache: 24}\n"
    )
    options = SearchOptions(space=str(space), storage=str(tmp_path / "r"), settings={"data_dir": str(root)})
    with pytest.raises(UserError, match="image_cache 24 is below the model's input size 32 px"):
        prepare(options)
    assert not cache_root.exists()
    space.write_text(space.read_text().replace("image_cache: 24", "image_cache: -1"))
    with pytest.raises(UserError, match="image_cache must not be negative"):
        prepare(options)
    space.write_text(space.read_text().replace("image_cache: -1", "image_cache: 32"))
    prepare(options)  # the driver builds the cache before Ray starts
    assert len([p for p in cache_root.iterdir() if p.is_dir()]) == 2
