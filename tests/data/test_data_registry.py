"""The dataset registry (geometry, classes, preprocessing), the NumPy transforms, and the registry's
geometry flowing into the model that ``train`` builds."""
import json

import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.data import (BatchIterator, DatasetError, Preprocess, affine_bilinear, center_crop, dataset_spec,
                                random_crop, resize_bilinear, standardize, write_idx, write_norb_matrix)
from tinygrad_caps.data import mnist, norb
from tinygrad_caps.data.idx import read_idx
from tinygrad_caps.data.registry import CIFAR_TEST, CIFAR_TRAIN, NORB_TEST, NORB_TRAIN
from tinygrad_caps.models.app.training.trainer import train

pytestmark = pytest.mark.usefixtures("private_cache")  # tests/data/conftest.py


def test_registered_geometry_and_classes():
    expected = {"mnist": (1, 28, 10), "fashion-mnist": (1, 28, 10), "smallnorb": (2, 32, 5), "cifar10": (3, 24, 10)}
    for name, geometry in expected.items():
        spec = dataset_spec(name)
        assert (spec.channels, spec.image_size, spec.num_classes) == geometry
    assert dataset_spec("smallnorb").classes == ("animal", "human", "airplane", "truck", "car")
    assert dataset_spec("cifar10").classes[0] == "airplane" and dataset_spec("fashion-mnist").classes[9] == "Ankle boot"
    assert dataset_spec("cifar10").test_preprocess is CIFAR_TEST
    assert dataset_spec("smallnorb").train_preprocess is NORB_TRAIN
    assert dataset_spec("smallnorb", image_size=32, channels=2).image_size == 32  # a checkpoint's own values
    with pytest.raises(ValueError, match="--image-size resizes only 'imagefolder'"):
        dataset_spec("mnist", image_size=32)
    with pytest.raises(ValueError, match="--channels applies only"):
        dataset_spec("cifar10", channels=1)


def test_an_unknown_name_is_an_idx_folder_with_geometry_from_its_files(tmp_path, monkeypatch):
    folder = tmp_path / "mine"
    folder.mkdir()
    for stem, n in (("train", 6), ("t10k", 4)):
        write_idx(folder / f"{stem}-images-idx3-ubyte", np.zeros((n, 12, 12), np.uint8))
        write_idx(folder / f"{stem}-labels-idx1-ubyte", np.arange(n, dtype=np.uint8) % 4)
    images_read = []
    monkeypatch.setattr(mnist, "read_idx", lambda path: images_read.append(path.name) or read_idx(path))
    spec = dataset_spec("mine", tmp_path)
    assert (spec.channels, spec.image_size, spec.num_classes) == (1, 12, 4)
    assert not [name for name in images_read if "images" in name]  # the geometry comes from the header
    images, labels = spec.load("train", tmp_path)
    assert images.shape == (6, 1, 12, 12) and labels.tolist() == [0, 1, 2, 3, 0, 1]
    with pytest.raises(DatasetError, match="not found"):
        dataset_spec("absent", tmp_path)
    write_idx(folder / "train-images-idx3-ubyte", np.zeros((6, 12, 12), np.float32))
    with pytest.raises(DatasetError, match=r"expected uint8 images .*\(6, 12, 12\) float32"):
        dataset_spec("mine", tmp_path)


def test_smallnorb_preprocessing_standardizes_then_crops_and_jitters():
    images = np.random.default_rng(0).integers(0, 256, (8, 2, 48, 48), dtype=np.uint8)
    test = NORB_TEST(images)
    assert test.shape == (8, 2, 32, 32) and test.dtype == np.float32
    full = standardize(images)
    np.testing.assert_allclose(full.mean(axis=(1, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(full.std(axis=(1, 2, 3)), 1, atol=1e-4)
    np.testing.assert_allclose(test, full[:, :, 8:40, 8:40], atol=1e-6)  # the centre 32x32 of the standardized 48x48
    a = NORB_TRAIN(images, np.random.default_rng(1))
    b = NORB_TRAIN(images, np.random.default_rng(1))
    assert a.shape == (8, 2, 32, 32) and np.array_equal(a, b)
    assert not np.allclose(a, test)
    # jitter: each image an affine function of one 32x32 window of the standardized image
    k = 3
    windows = [full[k, :, i:i + 32, j:j + 32] for i in range(17) for j in range(17)]
    residuals = []
    for window in windows:
        design = np.stack([window.ravel(), np.ones(window.size)], axis=1)
        coef, residual, *_ = np.linalg.lstsq(design, a[k].ravel(), rcond=None)
        residuals.append(float(np.abs(design @ coef - a[k].ravel()).max()))
    assert min(residuals) < 1e-4
    with pytest.raises(ValueError, match="need a generator"):
        NORB_TRAIN(images)


def test_cifar_preprocessing_takes_24x24_patches():
    images = np.arange(2 * 3 * 32 * 32, dtype=np.int64).reshape(2, 3, 32, 32) % 256
    images = images.astype(np.uint8)
    test = CIFAR_TEST(images)
    np.testing.assert_allclose(test, images[:, :, 4:28, 4:28] / 255.0, rtol=1e-6)
    train = CIFAR_TRAIN(images, np.random.default_rng(0))
    assert train.shape == (2, 3, 24, 24) and train.max() <= 1.0
    found = [(i, j) for i in range(9) for j in range(9)
             if np.allclose(train[0], images[0, :, i:i + 24, j:j + 24] / 255.0)]
    assert len(found) == 1


def test_crops_and_transforms():
    x = np.arange(2 * 1 * 6 * 6, dtype=np.float32).reshape(2, 1, 6, 6)
    assert center_crop(x, 2)[0, 0].tolist() == [[14, 15], [20, 21]]
    crops = random_crop(x, 3, np.random.default_rng(0))
    for k in range(2):
        assert any(np.array_equal(crops[k], x[k, :, i:i + 3, j:j + 3]) for i in range(4) for j in range(4))
    with pytest.raises(ValueError, match="center_crop"):
        center_crop(x, 7)
    dot = np.zeros((1, 1, 9, 9), np.float32)
    dot[0, 0, 1, 4] = 1.0  # above the centre
    assert np.argwhere(affine_bilinear(dot, 90)[0, 0] > 0.5).tolist() == [[4, 1]]  # counter-clockwise: to the left
    assert np.argwhere(affine_bilinear(dot, -90)[0, 0] > 0.5).tolist() == [[4, 7]]
    assert np.argwhere(affine_bilinear(dot, 0, (2, -3))[0, 0] > 0.5).tolist() == [[3, 1]]
    np.testing.assert_allclose(affine_bilinear(dot, 0, (0.5, 0))[0, 0, 1:3, 4], [0.5, 0.5])
    np.testing.assert_allclose(affine_bilinear(dot, 360)[0, 0], dot[0, 0], atol=1e-6)
    ramp = np.tile(np.arange(8, dtype=np.float32), (8, 1))[None, None]
    np.testing.assert_allclose(resize_bilinear(ramp, 4)[0, 0, 0], [0.5, 2.5, 4.5, 6.5])


def test_batches_with_preprocessing_are_seeded_and_shard_exactly():
    images = np.random.default_rng(0).integers(0, 256, (12, 2, 48, 48), dtype=np.uint8)
    labels = np.arange(12)
    whole = list(BatchIterator(images, labels, 6, shuffle=True, seed=4, preprocess=NORB_TRAIN))
    again = list(BatchIterator(images, labels, 6, shuffle=True, seed=4, preprocess=NORB_TRAIN))
    assert whole[0][0].shape == (6, 2, 32, 32)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(whole, again))
    shards = [list(BatchIterator(images, labels, 6, shuffle=True, seed=4, preprocess=NORB_TRAIN, shard=(r, 2)))
              for r in range(2)]
    for index, (x, y) in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([s[index][0] for s in shards]), x)
        np.testing.assert_array_equal(np.concatenate([s[index][1] for s in shards]), y)
    plain = next(iter(BatchIterator(images, labels, 12, preprocess=Preprocess())))[0]
    np.testing.assert_array_equal(plain, next(iter(BatchIterator(images, labels, 12)))[0])


TINY_CAPSNET = dict(conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4, kernel_size=5, batch_size=4,
                    epochs=1, lr=1e-3, lr_decay=0.9, seed=0, augment="default", device="cpu")


def test_registry_geometry_flows_into_the_trained_model(tmp_path):
    root = tmp_path / "norb"
    root.mkdir()
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        prefix = norb.SPLIT_PREFIX[split]
        write_norb_matrix(root / f"{prefix}-dat.mat", rng.integers(0, 256, (5, 2, 96, 96), dtype=np.uint8))
        write_norb_matrix(root / f"{prefix}-cat.mat", np.arange(5, dtype=np.int32))
    train(dict(TINY_CAPSNET, dataset="smallnorb", data_dir=str(root)), tmp_path / "run", show_progress=False,
          log=lambda *a: None)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["in_channels"], config["image_size"], config["num_classes"]) == (2, 32, 5)
    assert config["augment"] is None  # smallNORB's augmentation is its random crops
    state = tc.load(tmp_path / "run" / "checkpoints" / "last.npz")["model"]
    assert state["conv1.weight"].shape == (4, 2, 5, 5)
    assert state["decoder.fc3.weight"].shape[0] == 2 * 32 * 32


def test_image_folder_geometry_comes_from_the_options(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    for split in ("train", "test"):
        for name, value in (("a", 0), ("b", 128), ("c", 255)):
            (tmp_path / "f" / split / name).mkdir(parents=True)
            for k in range(2):
                Image.new("L", (30, 30), value).save(tmp_path / "f" / split / name / f"{k}.png")
    train(dict(TINY_CAPSNET, dataset="imagefolder", data_dir=str(tmp_path / "f"), image_size=14, channels=1),
          tmp_path / "run", show_progress=False, log=lambda *a: None)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["in_channels"], config["image_size"], config["num_classes"]) == (1, 14, 3)
    assert config["augment"] == "shift"


def test_cifar10_preset_and_the_none_of_the_above_flag():
    from tinygrad_caps.models import cli

    parse = lambda *argv: cli.parse_with_preset(cli.make_parser(), ["train", *argv])  # noqa: E731
    args = parse("--preset", "cifar10")
    assert (args.dataset, args.primary_types, args.leaky_routing) == ("cifar10", 64, True)
    args = parse("--preset", "cifar10", "--primary-types", "16")  # explicit options win
    assert (args.primary_types, args.leaky_routing) == (16, True)
    assert parse("--dataset", "cifar10", "--none-of-the-above").leaky_routing is True
    assert parse("--dataset", "cifar10").leaky_routing is False
    args = parse("--dataset", "imagefolder", "--image-size", "20", "--channels", "1")
    assert (args.image_size, args.channels, args.augment) == (20, 1, "default")
