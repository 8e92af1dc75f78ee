"""IDX reading and validation, where datasets are found, downloads (faked: tests never touch the
network), and the batch iterator's seeding and augmentation."""
import gzip
import hashlib
import io
import os
import urllib.request

import numpy as np
import pytest

from helpers import damaged_deflate

from tinygrad_caps import data
from tinygrad_caps.data import BatchIterator, DatasetError, IDXError, load_dataset, read_idx, write_idx


def write_split_files(folder, n_train=20, n_test=10, size=28, compress=True, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for stem, n in (("train", n_train), ("t10k", n_test)):
        suffix = ".gz" if compress else ""
        write_idx(folder / f"{stem}-images-idx3-ubyte{suffix}", rng.integers(0, 256, (n, size, size), dtype=np.uint8), compress)
        write_idx(folder / f"{stem}-labels-idx1-ubyte{suffix}", rng.integers(0, 10, n, dtype=np.uint8), compress)
    return folder

pytestmark = pytest.mark.usefixtures("offline_cache")  # tests/data/conftest.py


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.float32, np.float64])
def test_idx_round_trip(tmp_path, compress, dtype):
    array = (np.arange(24).reshape(2, 3, 4) * 3 - 5).astype(dtype) if dtype != np.uint8 else np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a.idx", array, compress)
    back = read_idx(tmp_path / "a.idx")
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_idx_validation_names_the_file_and_the_problem(tmp_path):
    write_idx(tmp_path / "good", np.zeros((4, 5), np.uint8))
    data = (tmp_path / "good").read_bytes()
    cases = {
        "truncated": (data[:-3], "truncated"),
        "longer": (data + b"\0", "longer than its header"),
        "magic": (b"\x01\x02" + data[2:], "bad magic number"),
        "type": (data[:2] + b"\x07" + data[3:], "element type"),
        "header": (data[:6], "header"),
        "badgzip": (gzip.compress(data)[:-10], "gzip"),
        "baddeflate": (damaged_deflate(data), "gzip"),
    }
    for name, (payload, message) in cases.items():
        (tmp_path / name).write_bytes(payload)
        with pytest.raises(IDXError, match=message):
            read_idx(tmp_path / name)
        with pytest.raises(ValueError, match=name):
            read_idx(tmp_path / name)


def test_a_large_compressed_file_read_again_is_decoded_once_and_a_changed_one_again(tmp_path, monkeypatch):
    """Fashion-MNIST-sized files are decoded once per process (a study's runs in one process read
    them again and again): the same bytes give an equal array of the caller's own; bytes changed in
    place, within the same timestamp tick and at the same size, are decoded again."""
    from tinygrad_caps.data import idx

    decoded = []
    monkeypatch.setattr(idx, "_decoded", {})
    read_capped = idx._read_capped
    monkeypatch.setattr(idx, "_read_capped", lambda *a, **k: decoded.append(1) or read_capped(*a, **k))
    rng = np.random.default_rng(0)
    first = rng.integers(0, 256, (2, idx.CACHED_BYTES // 2 + 100), dtype=np.uint8)  # incompressible: over the size
    path = tmp_path / "big.gz"
    write_idx(path, first, compress=True)
    assert path.stat().st_size >= idx.CACHED_BYTES
    a = read_idx(path)
    a[0, 0] ^= 0xFF  # the caller's own copy
    b = read_idx(path)
    np.testing.assert_array_equal(b, first)
    assert len(decoded) == 1
    second = first.copy()
    second[1, -1] ^= 1
    stat = path.stat()
    write_idx(path, second, compress=True)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as if in the same tick
    np.testing.assert_array_equal(read_idx(path), second)
    assert len(decoded) == 2
    small = tmp_path / "small.gz"
    write_idx(small, first[:, :1000], compress=True)
    read_idx(small), read_idx(small)
    assert len(decoded) == 4  # small files are not kept


def test_mnist_code_path_reads_small_idx_files_from_data_dir(tmp_path):
    folder = write_split_files(tmp_path / "data" / "mnist", n_train=12, n_test=7)
    images, labels = load_dataset("mnist", "train", data_dir=tmp_path / "data")
    assert images.shape == (12, 1, 28, 28) and images.dtype == np.uint8 and labels.dtype == np.int64
    test_images, _ = load_dataset("mnist", "test", data_dir=folder)
    assert test_images.shape == (7, 1, 28, 28)


def test_search_order_prefers_data_dir_then_the_cache(tmp_path, monkeypatch):
    write_split_files(tmp_path / "cache" / "mnist", n_train=5)
    write_split_files(tmp_path / "mine", n_train=9, compress=False)
    assert load_dataset("mnist", data_dir=tmp_path / "mine")[0].shape[0] == 9
    assert load_dataset("mnist")[0].shape[0] == 5


def test_fashion_mnist_falls_back_to_the_debian_folder(tmp_path, monkeypatch):
    write_split_files(tmp_path / "debian", n_train=4)
    monkeypatch.setitem(data.KNOWN["fashion-mnist"], "system_dirs", [str(tmp_path / "debian")])
    assert load_dataset("fashion-mnist")[0].shape[0] == 4


def test_offline_with_nothing_found_says_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(DatasetError) as info:
        load_dataset("mnist", data_dir=tmp_path / "empty")
    message = str(info.value)
    for stem in data.ALL_FILES:
        assert stem in message
    assert "downloads are off" in message and "--data-dir" in message
    with pytest.raises(DatasetError, match="network disabled"):
        load_dataset("mnist", data_dir=tmp_path / "empty", download_missing=True)
    monkeypatch.setitem(data.KNOWN["fashion-mnist"], "system_dirs", [])
    with pytest.raises(DatasetError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion-mnist", data_dir=tmp_path / "empty")


def test_download_checks_sha256_and_writes_atomically(tmp_path, monkeypatch):
    files = {}
    rng = np.random.default_rng(0)
    for stem in data.ALL_FILES:
        array = rng.integers(0, 10, (3, 28, 28) if "images" in stem else 3, dtype=np.uint8)
        buffer = tmp_path / "tmp.idx"
        write_idx(buffer, array)
        files[stem] = buffer.read_bytes()
    sums = {stem: hashlib.sha256(raw).hexdigest() for stem, raw in files.items()}
    monkeypatch.setitem(data.KNOWN["mnist"], "sha256", sums)
    bad_first_mirror = {"count": 0}

    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def fake_urlopen(url, timeout=None):
        stem = url.rsplit("/", 1)[1][:-3]
        if url.startswith(data.KNOWN["mnist"]["mirrors"][0]):
            bad_first_mirror["count"] += 1
            # a damaged deflate stream (zlib.error) or tampered content: either way the next mirror is tried
            return Response(damaged_deflate(files[stem]) if "images" in stem else gzip.compress(files[stem] + b"tampered"))
        return Response(gzip.compress(files[stem]))

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    images, labels = load_dataset("mnist", "test", download_missing=True)
    assert images.shape == (3, 1, 28, 28) and bad_first_mirror["count"] == 4
    cached = sorted(p.name for p in (tmp_path / "cache" / "mnist").iterdir())
    assert cached == sorted(f"{stem}.gz" for stem in data.ALL_FILES)


def test_batches_are_seeded_scaled_and_cover_everything():
    images = np.arange(10 * 4 * 4, dtype=np.uint8).reshape(10, 1, 4, 4)
    labels = np.arange(10)
    it = BatchIterator(images, labels, 4, shuffle=True, seed=3)
    first = [y.tolist() for _, y in it]
    assert sorted(sum(first, [])) == list(range(10)) and len(it) == 3
    assert first == [y.tolist() for _, y in it]  # same epoch, same order
    it.set_epoch(1)
    assert first != [y.tolist() for _, y in it]
    x, y = next(iter(BatchIterator(images, labels, 10)))
    assert x.dtype == np.float32 and x.max() <= 1.0 and np.allclose(x * 255, images)
    resumed = [y.tolist() for _, y in BatchIterator(images, labels, 4, shuffle=True, seed=3).batches(start=1)]
    assert resumed == first[1:]


def test_shift_and_flip_augmentation():
    images = np.zeros((200, 1, 8, 8), np.uint8)
    images[:, 0, 3:5, 3:5] = 255
    x, _ = next(iter(BatchIterator(images, np.zeros(200, int), 200, augment="shift", seed=0)))
    rows = [np.nonzero(x[k, 0].sum(axis=1))[0][0] - 3 for k in range(200)]
    cols = [np.nonzero(x[k, 0].sum(axis=0))[0][0] - 3 for k in range(200)]
    assert set(rows) == set(cols) == {-2, -1, 0, 1, 2}
    assert np.all(x.sum(axis=(1, 2, 3)) == 4)  # nothing lost: the blob stays inside
    edge = np.zeros((50, 1, 4, 4), np.uint8)
    edge[:, 0, :, 0] = 255
    shifted, _ = next(iter(BatchIterator(edge, np.zeros(50, int), 50, augment="shift", seed=1)))
    assert shifted.sum() < edge.sum() / 255.0  # zero padding: pixels shifted out are gone
    asym = np.zeros((100, 1, 5, 5), np.uint8)
    asym[:, 0, 2, 0] = 255
    flipped, _ = next(iter(BatchIterator(asym, np.zeros(100, int), 100, augment="shift+flip", seed=0, max_shift=0)))
    right = flipped[:, 0, 2, 4] == 1.0
    assert 20 < right.sum() < 80 and np.all(flipped[~right, 0, 2, 0] == 1.0)


def test_no_augmentation_unless_asked():
    images = np.random.default_rng(0).integers(0, 256, (6, 1, 5, 5), dtype=np.uint8)
    for augment in (None, "none"):
        x, _ = next(iter(BatchIterator(images, np.zeros(6, int), 6, augment=augment)))
        np.testing.assert_array_equal(x * 255, images)
    with pytest.raises(ValueError, match="batch_size"):
        BatchIterator(images, np.zeros(6, int), 0)
