"""Every dataset family, built on small data made in the test; the real loading code is exercised."""

import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from vitplast_tune.data import batches, datasets, transforms
from vitplast_tune.data.splits import SmallImages, split_indices
from vitplast_tune.errors import UserError
from vitplast_tune.vit import models

CONFIG = {
    "input_size": (3, 32, 32),
    "mean": (0.5, 0.5, 0.5),
    "std": (0.5, 0.5, 0.5),
    "interpolation": "bilinear",
    "crop_pct": 1.0,
}


def check_image_splits(splits, num_classes):
    assert splits.num_classes == num_classes
    for dataset in (splits.train, splits.val, splits.test):
        assert len(dataset) > 0
        image, label = dataset[0]
        assert image.shape == (3, 32, 32) and image.dtype == torch.float32
        assert float(image.min()) >= -1.01 and float(image.max()) <= 1.01  # normalized with mean/std 0.5
        assert 0 <= int(label) < num_classes


def save_png(path, seed):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(path)


def test_digits_splits_are_seeded_and_the_test_split_fixed():
    a = datasets.load_dataset("digits", CONFIG, seed=0)
    b = datasets.load_dataset("digits", CONFIG, seed=0)
    c = datasets.load_dataset("digits", CONFIG, seed=1)
    assert (len(a.train), len(a.val), len(a.test)) == (1150, 288, 359)
    assert np.array_equal(a.val.indices, b.val.indices)
    assert not np.array_equal(a.val.indices, c.val.indices)
    assert np.array_equal(a.test.indices, c.test.indices)
    assert a.train.images.dtype == np.uint8 and a.train.images.shape[1:] == (1, 8, 8)  # held small: native 8x8
    images, labels = next(iter(batches.eval_batches(a.val, 16)))
    assert (
        images.shape == (16, 3, 32, 32)
        and images.dtype == torch.float32
        and torch.equal(labels, torch.as_tensor(a.val.labels[a.val.indices[:16]]))
    )
    rest, test = split_indices(1797, 0.2, seed=10_007)
    train, val = split_indices(len(rest), 0.2, seed=0)
    assert not set(rest) & set(test) and not set(train) & set(val)  # disjoint splits
    assert check_image_splits(a, 10) is None


def test_imagefolder_with_and_without_a_test_folder(tmp_path):
    for split, count in (("train", 6), ("test", 2)):
        for cls in ("cat", "dog", "eel"):
            for i in range(count):
                save_png(tmp_path / "with" / split / cls / f"{i}.png", hash((split, cls, i)) % 1000)
                save_png(tmp_path / "without" / "train" / cls / f"{split}{i}.png", hash((cls, split, i)) % 1000)
    with_test = datasets.load_dataset("imagefolder", CONFIG, data_dir=tmp_path / "with")
    check_image_splits(with_test, 3)
    assert (len(with_test.train), len(with_test.val), len(with_test.test)) == (14, 4, 6)
    without = datasets.load_dataset("imagefolder", CONFIG, data_dir=tmp_path / "without")
    check_image_splits(without, 3)
    assert len(without.train) + len(without.val) + len(without.test) == 24 and len(without.test) == 5
    assert datasets.num_classes("imagefolder", tmp_path / "with") == 3
    with pytest.raises(UserError, match="train/<class>/<images>"):
        datasets.load_dataset("imagefolder", CONFIG, data_dir=tmp_path / "missing")


@pytest.mark.parametrize(
    "test_classes, problem", [(("cat", "eel"), "missing dog"), (("cat", "dog", "eel", "fox"), "extra fox")]
)
def test_imagefolder_test_classes_must_be_trains(tmp_path, test_classes, problem):
    for cls in ("cat", "dog", "eel"):
        for i in range(3):
            save_png(tmp_path / "train" / cls / f"{i}.png", i)
    for cls in test_classes:
        save_png(tmp_path / "test" / cls / "0.png", 7)
    with pytest.raises(UserError, match=f"must have the classes of .*train \\({problem}\\)"):
        datasets.load_dataset("imagefolder", CONFIG, data_dir=tmp_path)
    with pytest.raises(UserError, match=problem):  # checked before a search starts, too
        datasets.num_classes("imagefolder", tmp_path)


def test_imagefolder_test_labels_are_trains_by_name(tmp_path):
    for split in ("train", "test"):
        for i, cls in enumerate(("cat", "dog", "eel")):
            for j in range(3):
                save_png(tmp_path / split / cls / f"{j}.png", 100 * i + j)
    splits = datasets.load_dataset("imagefolder", CONFIG, data_dir=tmp_path)
    train_set = splits.train.dataset
    assert splits.test.class_to_idx == train_set.class_to_idx and splits.num_classes == 3


def test_cifar10c_from_npy_files(tmp_path):
    folder = tmp_path / "CIFAR-10-C"
    folder.mkdir()
    rng = np.random.default_rng(0)
    np.save(folder / "snow.npy", rng.integers(0, 255, (5 * 40, 32, 32, 3), dtype=np.uint8))
    labels = np.tile(np.arange(10), 20).astype(np.uint8)
    np.save(folder / "labels.npy", labels)
    splits = datasets.load_dataset("cifar10c:snow", CONFIG, data_dir=tmp_path)
    check_image_splits(splits, 10)
    assert len(splits.train) + len(splits.val) + len(splits.test) == 40  # severity 5 only
    with pytest.raises(UserError, match="put gaussian_noise.npy and labels.npy"):
        datasets.load_dataset("cifar10c:gaussian_noise", CONFIG, data_dir=tmp_path)
    with pytest.raises(UserError, match='needs a corruption, e.g. "cifar10c:snow"'):
        datasets.check_dataset_name("cifar10c")


def fake_cifar(root, folder, files, label_key, meta_name, meta_key, classes):
    base = root / folder
    base.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for name in files:
        batch = {"data": rng.integers(0, 255, (20, 3072), dtype=np.uint8), label_key: list(np.arange(20) % classes)}
        (base / name).write_bytes(pickle.dumps(batch))
    (base / meta_name).write_bytes(pickle.dumps({meta_key: [f"c{i}" for i in range(classes)]}))


@pytest.mark.parametrize("name, classes", [("cifar10", 10), ("cifar100", 100)])
def test_torchvision_cifar(tmp_path, monkeypatch, name, classes):
    import torchvision.datasets as tvd

    if name == "cifar10":
        fake_cifar(
            tmp_path,
            "cifar-10-batches-py",
            [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"],
            "labels",
            "batches.meta",
            "label_names",
            10,
        )
        monkeypatch.setattr(tvd.CIFAR10, "_check_integrity", lambda self: True)
        monkeypatch.setattr(tvd.cifar, "check_integrity", lambda *args: True)
    else:
        fake_cifar(tmp_path, "cifar-100-python", ["train", "test"], "fine_labels", "meta", "fine_label_names", 100)
        monkeypatch.setattr(tvd.CIFAR100, "_check_integrity", lambda self: True)
        monkeypatch.setattr(tvd.cifar, "check_integrity", lambda *args: True)
    splits = datasets.load_dataset(name, CONFIG, data_dir=tmp_path, seed=0)
    check_image_splits(splits, classes)
    train_total = 100 if name == "cifar10" else 20
    assert len(splits.train) + len(splits.val) == train_total and len(splits.val) == train_total // 5
    assert isinstance(splits.train, SmallImages) and splits.train.images.dtype == np.uint8  # held small
    assert set(splits.test.indices) == set(range(train_total, train_total + 20))  # the published test split


def test_pets_and_flowers(tmp_path, monkeypatch):
    import scipy.io
    import torchvision.datasets as tvd

    pets = tmp_path / "oxford-iiit-pet"
    (pets / "annotations" / "trimaps").mkdir(parents=True)
    for split, ids in (("trainval", range(10)), ("test", range(10, 14))):
        lines = []
        for i in ids:
            breed = ("Abyssinian", "beagle")[i % 2]
            save_png(pets / "images" / f"{breed}_{i}.jpg", i)
            lines.append(f"{breed}_{i} {1 + i % 2} {1 + i % 2} 1")
        (pets / "annotations" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    splits = datasets.load_dataset("pets", CONFIG, data_dir=tmp_path)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (8, 2, 4)
    check_image_splits(splits, 37)

    flowers = tmp_path / "flowers-102"
    for i in range(1, 13):
        save_png(flowers / "jpg" / f"image_{i:05d}.jpg", i)
    scipy.io.savemat(flowers / "imagelabels.mat", {"labels": np.array([1 + i % 3 for i in range(12)])})
    scipy.io.savemat(
        flowers / "setid.mat", {"trnid": np.arange(1, 6), "valid": np.arange(6, 8), "tstid": np.arange(8, 13)}
    )
    monkeypatch.setattr(tvd.Flowers102, "_check_integrity", lambda self: True)
    splits = datasets.load_dataset("flowers102", CONFIG, data_dir=tmp_path)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (4, 1, 5)
    check_image_splits(splits, 102)


def test_missing_torchvision_dataset_says_what_to_do(tmp_path):
    with pytest.raises(UserError, match=r'dataset "cifar10" not found in .*; pass --download'):
        datasets.load_dataset("cifar10", CONFIG, data_dir=tmp_path)
    with pytest.raises(UserError, match=r'unknown dataset "cifar1O"'):
        datasets.load_dataset("cifar1O", CONFIG)


def test_training_transforms_are_the_papers():
    from timm.data.transforms import RandomResizedCropAndInterpolation
    from torchvision import transforms as T

    train = transforms.per_image(CONFIG, train=True).transforms
    assert isinstance(train[0], RandomResizedCropAndInterpolation) and isinstance(train[1], T.RandomHorizontalFlip)
    assert train[0].scale == (0.08, 1.0) and not any(isinstance(t, T.ColorJitter) for t in train)
    evaluation = transforms.per_image(
        {**CONFIG, "input_size": (3, 224, 224), "crop_pct": 0.875}, train=False
    ).transforms
    assert isinstance(evaluation[0], T.Resize) and evaluation[0].size == 256 and evaluation[1].size == (224, 224)
    squash = transforms.per_image(
        {**CONFIG, "input_size": (3, 224, 224), "crop_pct": 0.875, "crop_mode": "squash"}, False
    )
    assert squash.transforms[0].size == (256, 256)  # the config's crop_mode is honoured


def test_local_weights_load_through_timms_pretrained_path(tmp_path):
    import timm
    from safetensors.torch import save_file

    source = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=7)
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    save_file(state, tmp_path / "w.safetensors")
    torch.save(state, tmp_path / "w.pth")
    for path in (tmp_path / "w.safetensors", tmp_path / "w.pth"):
        model = models.create_model("vit_tiny_patch16_224.augreg_in21k", 3, weights=path, img_size=32, patch_size=8)
        assert torch.equal(model.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)
        assert torch.equal(model.pos_embed, source.pos_embed)
        assert model.head.out_features == 3  # a new head for the downstream classes
    with pytest.raises(UserError, match="does not exist"):
        models.create_model("vit_tiny_patch16_224", 3, weights=tmp_path / "nope.safetensors")


def test_model_data_config_drives_the_transforms():
    config = models.pretrained_data_config("vit_base_patch16_224.orig_in21k")
    assert config["input_size"] == (3, 224, 224) and config["interpolation"] == "bicubic"
    assert models.pretrained_data_config("deit_small_patch16_224")["mean"] == pytest.approx((0.485, 0.456, 0.406))
    decoded = datasets.decode_dataset("digits", models.pretrained_data_config("vit_small_patch16_224"))
    assert decoded.images.shape[1:] == (1, 8, 8) and decoded.nbytes < 200_000  # uint8 at native resolution
    train = datasets.load_dataset(
        "digits", models.pretrained_data_config("vit_small_patch16_224"), decoded=decoded
    ).train
    assert isinstance(train, SmallImages) and train.images is decoded.images  # shared, not copied


def test_each_dataset_has_its_default_augmentation_and_a_run_overrides_it(tmp_path):
    from timm.data.transforms import RandomResizedCropAndInterpolation

    named = {name: "cifar10c:snow" if name == "cifar10c" else name for name in datasets.list_datasets()}
    defaults = {name: datasets.resolve_augmentation(full, None) for name, full in named.items()}
    natural = ("cifar10", "cifar100", "cifar10c", "flowers102", "imagefolder", "pets")
    assert defaults == {**dict.fromkeys(natural, "paper"), "digits": "light", "fractals": "light"}
    assert datasets.resolve_augmentation("digits", "auto") == "light"
    assert datasets.resolve_augmentation("digits", "none") == "none"
    assert datasets.load_dataset("digits", CONFIG).train.augment == "light"
    overridden = datasets.load_dataset("digits", CONFIG, augment="paper")
    assert overridden.train.augment == "paper" and not overridden.val.train and not overridden.test.train
    with pytest.raises(UserError, match='unknown augmentation "flip"'):
        datasets.load_dataset("digits", CONFIG, augment="flip")

    for i in range(6):  # a file dataset's training split takes the recipe too
        save_png(tmp_path / "train" / f"c{i % 2}" / f"{i}.png", i)
    first = lambda splits: splits.train.dataset.transform.transforms[0]
    assert isinstance(
        first(datasets.load_dataset("imagefolder", CONFIG, data_dir=tmp_path)), RandomResizedCropAndInterpolation
    )
    plain = datasets.load_dataset("imagefolder", CONFIG, data_dir=tmp_path, augment="none")
    assert [type(t) for t in plain.train.dataset.transform.transforms] == [
        type(t) for t in plain.val.dataset.transform.transforms
    ]


# ----------------------------------------------------------------------------- timm.data.create_dataset, the fallback


def test_timm_folder_dataset_by_name(tmp_path):
    """An unregistered timm name (torch/folder: torchvision's ImageFolder by way of timm) on local class folders."""
    for split, count in (("train", 6), ("validation", 2)):
        for cls in ("cat", "dog", "eel"):
            for i in range(count):
                save_png(tmp_path / "with" / split / cls / f"{i}.png", hash((split, cls, i)) % 1000)
                save_png(tmp_path / "without" / "train" / cls / f"{split}{i}.png", hash((cls, split, i)) % 1000)
    Image.fromarray(np.zeros((20, 20), np.uint8)).save(tmp_path / "with" / "train" / "cat" / "gray.png")  # mode L
    assert datasets.num_classes("torch/folder", tmp_path / "with") == 3
    with_val = datasets.load_dataset("torch/folder", CONFIG, data_dir=tmp_path / "with", seed=1)
    check_image_splits(with_val, 3)
    assert (len(with_val.train), len(with_val.val), len(with_val.test)) == (15, 4, 6)  # test: the validation folder
    assert all(d.shape == (3, 32, 32) for d, _ in (with_val.train.dataset[i] for i in range(19)))  # grey as RGB
    without = datasets.load_dataset("torch/folder", CONFIG, data_dir=tmp_path / "without")
    check_image_splits(without, 3)
    assert len(without.train) + len(without.val) + len(without.test) == 24 and len(without.test) == 5


@pytest.mark.parametrize(
    "name, download, message",
    [
        ("torch/cifar10", False, r"Dataset not found .*; pass --download to fetch it"),
        ("torch/cifar10", True, r"URLError: .*; with no network, fetch it elsewhere"),
        ("torch/nope", False, "Unknown torchvision dataset nope"),
        ("hfds/beans", True, r'dataset "hfds/beans" \(timm.data.create_dataset, split train'),
    ],
)
def test_a_timm_dataset_that_cannot_load_is_one_line(tmp_path, name, download, message):
    with pytest.raises(UserError, match=message) as caught:
        datasets.load_dataset(name, CONFIG, data_dir=tmp_path, download=download)
    assert "\n" not in str(caught.value)


def test_names_neither_registered_nor_timms_are_refused_with_both_lists():
    with pytest.raises(UserError, match=r'unknown dataset "tfds/beans".*or a timm.data.create_dataset name'):
        datasets.check_dataset_name("tfds/beans")  # streaming datasets: no random access for seeded splits
    datasets.check_dataset_name("torch/cifar100")
    datasets.check_dataset_name("HFDS/user/set")
