"""smallNORB, CIFAR-10 and image-folder loaders on small files written here in the exact formats
(good files, wrong magic, truncation, wrong dimension counts, labels out of range), their caches
and (faked) downloads. Nothing touches the network."""
import gzip
import hashlib
import io
import os
import tarfile

import numpy as np
import pytest

from tinygrad_caps.data import (DatasetError, NORBError, cache, cifar, folder, load_dataset, norb, read_norb_matrix,
                                write_norb_matrix)

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from helpers import damaged_deflate, damaged_npy_header  # noqa: E402

pytestmark = pytest.mark.usefixtures("offline_cache")  # tests/data/conftest.py


# ---------------------------------------------------------------- smallNORB

def write_norb_split(root, split, n=4, compress=False, seed=0, labels=None, info=True):
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    prefix, suffix = norb.SPLIT_PREFIX[split], ".gz" if compress else ""
    images = rng.integers(0, 256, (n, 2, 96, 96), dtype=np.uint8)
    labels = np.asarray(labels if labels is not None else np.arange(n) % 5, dtype=np.int32)
    write_norb_matrix(root / f"{prefix}-dat.mat{suffix}", images, compress)
    write_norb_matrix(root / f"{prefix}-cat.mat{suffix}", labels, compress)
    if info:
        write_norb_matrix(root / f"{prefix}-info.mat{suffix}", rng.integers(0, 9, (n, 4)).astype(np.int32), compress)
    return images, labels


def test_norb_header_layout_matches_the_official_files(tmp_path):
    write_norb_matrix(tmp_path / "cat.mat", np.array([1, 2, 3], np.int32))
    raw = (tmp_path / "cat.mat").read_bytes()
    # magic 0x1E3D4C54 (int32) little-endian, 1 dimension, then three sizes (3, 1, 1), then the data
    assert raw[:4] == bytes([0x54, 0x4C, 0x3D, 0x1E])
    assert np.frombuffer(raw[4:20], "<i4").tolist() == [1, 3, 1, 1]
    assert np.frombuffer(raw[20:], "<i4").tolist() == [1, 2, 3]
    write_norb_matrix(tmp_path / "dat.mat", np.zeros((2, 2, 3, 3), np.uint8))
    raw = (tmp_path / "dat.mat").read_bytes()
    assert raw[:4] == bytes([0x55, 0x4C, 0x3D, 0x1E]) and np.frombuffer(raw[4:24], "<i4").tolist() == [4, 2, 2, 3, 3]
    assert len(raw) == 24 + 36


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.float32, np.float64])
def test_norb_matrix_round_trip(tmp_path, dtype, compress):
    array = (np.arange(60).reshape(3, 4, 5) - 7).astype(dtype) if dtype != np.uint8 else np.arange(60, dtype=np.uint8)
    write_norb_matrix(tmp_path / "m.mat", array, compress)
    back = read_norb_matrix(tmp_path / "m.mat")
    assert back.dtype == np.dtype(dtype) and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_norb_matrix_validation_names_the_file(tmp_path):
    write_norb_matrix(tmp_path / "good", np.zeros((4, 5), np.int32))
    data = (tmp_path / "good").read_bytes()
    cases = {
        "magic": (b"\x00\x00\x00\x00" + data[4:], "bad magic number"),
        "truncated": (data[:-3], "truncated"),
        "header": (data[:10], "truncated in the header"),
        "longer": (data + b"\0", "longer than its header"),
        "ndim0": (data[:4] + np.int32(0).tobytes() + data[8:], "0 dimensions"),
        "ndim17": (data[:4] + np.int32(17).tobytes() + data[8:], "17 dimensions"),
        "badgzip": (gzip.compress(data)[:-12], "gzip|truncated"),
        "baddeflate": (damaged_deflate(data), "gzip stream is truncated or corrupt"),
    }
    for name, (payload, message) in cases.items():
        (tmp_path / name).write_bytes(payload)
        with pytest.raises(NORBError, match=message) as info:
            read_norb_matrix(tmp_path / name)
        assert name in str(info.value)


@pytest.mark.parametrize("compress", [False, True])
def test_smallnorb_loads_downsampled_stereo_pairs(tmp_path, compress):
    images, labels = write_norb_split(tmp_path / "smallnorb", "test", n=5, compress=compress)
    x, y = load_dataset("smallnorb", "test", data_dir=tmp_path)
    assert x.shape == (5, 2, 48, 48) and x.dtype == np.uint8 and y.dtype == np.int64
    np.testing.assert_array_equal(y, labels)
    blocks = images.reshape(5, 2, 48, 2, 48, 2).astype(np.float64).mean(axis=(3, 5))
    np.testing.assert_array_equal(x, np.rint(blocks).astype(np.uint8))


def test_smallnorb_rejects_bad_labels_shapes_and_mismatches(tmp_path):
    write_norb_split(tmp_path / "a", "train", n=3, labels=[0, 5, 1])
    with pytest.raises(DatasetError, match="label 5 at index 1 is out of range"):
        load_dataset("smallnorb", "train", data_dir=tmp_path / "a")
    write_norb_split(tmp_path / "b", "train", n=3)
    write_norb_matrix(tmp_path / "b" / f"{norb.SPLIT_PREFIX['train']}-cat.mat", np.zeros(2, np.int32))
    with pytest.raises(DatasetError, match="cat.mat: expected 3 int32 labels"):
        load_dataset("smallnorb", "train", data_dir=tmp_path / "b")
    write_norb_split(tmp_path / "c", "train", n=2)
    write_norb_matrix(tmp_path / "c" / f"{norb.SPLIT_PREFIX['train']}-dat.mat", np.zeros((2, 1, 96, 96), np.uint8))
    with pytest.raises(DatasetError, match=r"dat.mat: expected uint8 images \(N, 2, 96, 96\)"):
        load_dataset("smallnorb", "train", data_dir=tmp_path / "c")
    write_norb_split(tmp_path / "d", "train", n=2)
    write_norb_matrix(tmp_path / "d" / f"{norb.SPLIT_PREFIX['train']}-info.mat", np.zeros((3, 4), np.int32))
    with pytest.raises(DatasetError, match="info.mat: expected info of shape"):
        load_dataset("smallnorb", "train", data_dir=tmp_path / "d")


def test_smallnorb_missing_files_say_where_to_put_them(tmp_path):
    with pytest.raises(DatasetError, match="downloads are off") as info:
        load_dataset("smallnorb", "test", data_dir=tmp_path / "none")
    assert "smallnorb-5x01235x9x18x6x2x96x96-testing-dat.mat" in str(info.value)


def test_smallnorb_download_checks_size_and_sha256(tmp_path, monkeypatch):
    source = tmp_path / "source"
    write_norb_split(source, "test", n=2, compress=True)
    payloads = {p.name[:-3]: p.read_bytes() for p in source.iterdir()}
    sums = {stem: (len(raw), hashlib.sha256(raw).hexdigest()) for stem, raw in payloads.items()}
    monkeypatch.setattr(norb, "GZ_SHA256", dict(norb.GZ_SHA256, **sums))
    served = {}

    def fake_urlopen(url, timeout=None):
        stem = url.rsplit("/", 1)[1][:-3]
        served[stem] = True
        return io.BytesIO(payloads[stem])

    monkeypatch.setattr(cache.urllib.request, "urlopen", fake_urlopen)
    x, y = load_dataset("smallnorb", "test", download_missing=True)
    assert x.shape == (2, 2, 48, 48) and len(served) == 3
    assert sorted(p.name for p in (tmp_path / "cache" / "smallnorb").iterdir()) == sorted(f"{s}.gz" for s in payloads)
    for p in (tmp_path / "cache" / "smallnorb").iterdir():
        p.unlink()
    monkeypatch.setattr(cache.urllib.request, "urlopen", lambda url, timeout=None: io.BytesIO(payloads[
        url.rsplit("/", 1)[1][:-3]] + b"x"))
    with pytest.raises(DatasetError, match="expected"):
        load_dataset("smallnorb", "test", download_missing=True)


# ---------------------------------------------------------------- CIFAR-10

def cifar_records(labels, seed=0):
    rng = np.random.default_rng(seed)
    records = rng.integers(0, 256, (len(labels), cifar.RECORD_BYTES), dtype=np.uint8)
    records[:, 0] = labels
    return records


def write_cifar_archive(path, per_batch=3, bad=None, drop=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    contents = {}
    with tarfile.open(path, "w:gz") as archive:
        for k, name in enumerate(cifar.SPLIT_MEMBERS["train"] + cifar.SPLIT_MEMBERS["test"]):
            if name == drop:
                continue
            records = cifar_records(np.arange(per_batch) % 10, seed=k)
            data = records.tobytes() if name != bad else records.tobytes()[:-5]
            contents[name] = records
            member = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return contents


def test_cifar_records_are_label_then_rgb_planes():
    records = cifar_records([7, 2])
    images, labels = cifar.parse_cifar_records(records.tobytes())
    assert images.shape == (2, 3, 32, 32) and images.dtype == np.uint8 and labels.tolist() == [7, 2]
    np.testing.assert_array_equal(images[1, 0].ravel(), records[1, 1:1025])  # red plane, row-major
    np.testing.assert_array_equal(images[1, 2, 31], records[1, 1 + 2048 + 31 * 32:1 + 3072])  # blue, last row


def test_cifar_archive_loads_both_splits(tmp_path):
    contents = write_cifar_archive(tmp_path / "cifar10" / cifar.ARCHIVE)
    x, y = load_dataset("cifar10", "train", data_dir=tmp_path)
    assert x.shape == (15, 3, 32, 32) and y.tolist() == [0, 1, 2] * 5
    x, y = load_dataset("cifar10", "test", data_dir=tmp_path)
    np.testing.assert_array_equal(x.reshape(3, -1), contents["test_batch.bin"][:, 1:])


def test_cifar_extracted_folder_works_too(tmp_path):
    folder_path = tmp_path / "cifar-10-batches-bin"
    folder_path.mkdir()
    for name in cifar.SPLIT_MEMBERS["test"]:
        (folder_path / name).write_bytes(cifar_records([1, 9]).tobytes())
    x, y = cifar.load_cifar10("test", data_dir=tmp_path)
    assert x.shape == (2, 3, 32, 32) and y.tolist() == [1, 9]


def test_cifar_errors_name_the_member(tmp_path):
    write_cifar_archive(tmp_path / "a" / cifar.ARCHIVE, bad="data_batch_3.bin")
    with pytest.raises(DatasetError, match="data_batch_3.bin: .* not a whole number"):
        load_dataset("cifar10", "train", data_dir=tmp_path / "a")
    write_cifar_archive(tmp_path / "b" / cifar.ARCHIVE, drop="test_batch.bin")
    with pytest.raises(DatasetError, match="lacks test_batch.bin"):
        load_dataset("cifar10", "test", data_dir=tmp_path / "b")
    archive = tmp_path / "damaged" / cifar.ARCHIVE
    write_cifar_archive(archive)
    tar = gzip.decompress(archive.read_bytes())  # a second gzip member, damaged: the first member's files read fine
    archive.write_bytes(gzip.compress(tar[:2048]) + damaged_deflate(tar[2048:]))
    with pytest.raises(DatasetError, match="not a readable tar archive"):
        load_dataset("cifar10", "test", data_dir=tmp_path / "damaged")
    with pytest.raises(DatasetError, match="label 12 of record 1 is out of range"):
        cifar.parse_cifar_records(cifar_records([3, 12]).tobytes(), "x.bin")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / cifar.ARCHIVE).write_bytes(b"not a tar archive at all")
    with pytest.raises(DatasetError, match="not a readable tar archive"):
        load_dataset("cifar10", "test", data_dir=tmp_path / "c")
    with pytest.raises(DatasetError, match="cifar-10-binary.tar.gz"):
        load_dataset("cifar10", "test", data_dir=tmp_path / "nothing")


def test_cifar_download_checks_the_archive(tmp_path, monkeypatch):
    write_cifar_archive(tmp_path / "src" / cifar.ARCHIVE)
    payload = (tmp_path / "src" / cifar.ARCHIVE).read_bytes()
    monkeypatch.setattr(cifar, "ARCHIVE_SIZE", len(payload))
    monkeypatch.setattr(cifar, "ARCHIVE_SHA256", hashlib.sha256(payload).hexdigest())

    tampered = payload[:100] + bytes([payload[100] ^ 1]) + payload[101:]
    monkeypatch.setattr(cache.urllib.request, "urlopen", lambda url, timeout=None: io.BytesIO(tampered))
    with pytest.raises(DatasetError, match="SHA-256 mismatch"):
        load_dataset("cifar10", "test", download_missing=True)
    assert not (tmp_path / "cache" / "cifar10" / cifar.ARCHIVE).exists()
    monkeypatch.setattr(cache.urllib.request, "urlopen", lambda url, timeout=None: io.BytesIO(payload))
    assert load_dataset("cifar10", "test", download_missing=True)[0].shape == (3, 3, 32, 32)
    assert (tmp_path / "cache" / "cifar10" / cifar.ARCHIVE).read_bytes() == payload


# ---------------------------------------------------------------- image folders

CLASS_COLORS = {"circle": (255, 0, 0), "square": (0, 255, 0), "stripe": (0, 0, 255)}


def write_image_folder(root, per_class=(3, 2), size=(20, 14), mode="RGB", suffix=".png"):
    for split, count in zip(("train", "test"), per_class):
        for name, color in CLASS_COLORS.items():
            target = root / split / name
            target.mkdir(parents=True, exist_ok=True)
            for k in range(count):
                image = Image.new("RGB", size, color)
                image.convert(mode).save(target / f"{k}{suffix}")
    return root


@pytest.mark.parametrize("channels", [1, 3])
def test_image_folder_decodes_resizes_and_labels_by_class_folder(tmp_path, channels):
    root = write_image_folder(tmp_path / "shapes")
    x, y = load_dataset("imagefolder", "train", data_dir=root, image_size=8, channels=channels)
    assert x.shape == (9, channels, 8, 8) and x.dtype == np.uint8 and y.tolist() == [0] * 3 + [1] * 3 + [2] * 3
    if channels == 3:  # sorted classes: circle (red), square (green), stripe (blue)
        assert x[0, :, 4, 4].tolist() == [255, 0, 0] and x[8, :, 4, 4].tolist() == [0, 0, 255]
    else:
        assert x[0, 0, 4, 4] == round(0.299 * 255) and x[3, 0, 4, 4] == round(0.587 * 255)
    assert load_dataset("imagefolder", "test", data_dir=root, image_size=8, channels=channels)[0].shape[0] == 6


def test_image_folder_reads_grayscale_and_jpeg_files(tmp_path):
    root = write_image_folder(tmp_path / "gray", mode="L", suffix=".jpg")
    x, _ = load_dataset("imagefolder", "test", data_dir=root, image_size=5, channels=3)
    assert x.shape == (6, 3, 5, 5) and np.all(x[:, 0] == x[:, 1])


def test_image_folder_cache_skips_decoding_until_the_folder_changes(tmp_path, monkeypatch):
    root = write_image_folder(tmp_path / "shapes")
    first = load_dataset("imagefolder", "train", data_dir=root, image_size=6, channels=3)
    assert len(list((tmp_path / "cache" / "imagefolder").glob("*.npy"))) == 2

    def no_decoding(*args):
        raise AssertionError("decoded although the cache is valid")

    monkeypatch.setattr(folder, "_decode", no_decoding)
    second = load_dataset("imagefolder", "train", data_dir=root, image_size=6, channels=3)
    np.testing.assert_array_equal(first[0], second[0])
    changed = root / "train" / "circle" / "0.png"
    Image.new("RGB", (20, 14), (9, 9, 9)).save(changed)
    os.utime(changed, ns=(1, 1))
    with pytest.raises(AssertionError, match="decoded"):
        load_dataset("imagefolder", "train", data_dir=root, image_size=6, channels=3)



@pytest.mark.parametrize("damage", ["truncated", "broken header"])
def test_a_damaged_image_folder_cache_is_rebuilt(tmp_path, damage):
    root = write_image_folder(tmp_path / "shapes")
    first = load_dataset("imagefolder", "train", data_dir=root, image_size=6, channels=3)
    images_cache = next((tmp_path / "cache" / "imagefolder").glob("*-images.npy"))
    data = images_cache.read_bytes()
    images_cache.write_bytes(data[:100] if damage == "truncated" else damaged_npy_header(data))
    again = load_dataset("imagefolder", "train", data_dir=root, image_size=6, channels=3)
    np.testing.assert_array_equal(first[0], again[0])
    assert images_cache.read_bytes() == data

def test_image_folder_errors_name_the_problem(tmp_path):
    root = write_image_folder(tmp_path / "shapes")
    with pytest.raises(DatasetError, match="needs --data-dir"):
        load_dataset("imagefolder", "train")
    for child in (root / "test").glob("*/*"):
        child.unlink()
    with pytest.raises(DatasetError, match="holds no images") as info:
        load_dataset("imagefolder", "test", data_dir=root, image_size=6)
    assert "circle" in str(info.value)
    write_image_folder(root)
    (root / "test" / "circle" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DatasetError, match="broken.png: unreadable image"):
        load_dataset("imagefolder", "test", data_dir=root, image_size=6)
    (root / "train" / "circle" / "0.png").unlink()
    other = write_image_folder(tmp_path / "no-test")
    for path in sorted((other / "test").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (other / "test").rmdir()
    with pytest.raises(DatasetError, match="no 'test' split"):
        load_dataset("imagefolder", "test", data_dir=other, image_size=6)
    (other / "test" / "unknown").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(other / "test" / "unknown" / "a.png")
    with pytest.raises(DatasetError, match="unknown are not among the training classes"):
        load_dataset("imagefolder", "test", data_dir=other, image_size=6)
