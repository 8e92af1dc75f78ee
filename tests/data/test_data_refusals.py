"""Hostile or inconsistent datasets, case by case, through ``tinygrad-caps train`` (and ``evaluate``):
each ends in one line on stderr and exit status 2, naming what is wrong, with no run folder; never
a traceback, a silent fallback to another copy, or a success on an empty or one-class dataset.
The generated cases are in test_fuzz_data.py."""
import gzip
import os
import struct
import urllib.error
import warnings

import numpy as np
import pytest

from dataset_files import (cifar_archive, cifar_members, norb_bytes, norb_header, png_header_only,
                           run_cli, train_argv, write_image_folder, write_norb_split)
from helpers import write_striped_dataset
from tinygrad_caps.data import DatasetError, NORBError, cache, cifar, folder, norb, read_norb_matrix
from tinygrad_caps.data.registry import DatasetSpec
from tinygrad_caps.data.preprocess import UNIT_SCALE
from tinygrad_caps.models.app.training.reporting import one_line

pytest.importorskip("PIL")

pytestmark = pytest.mark.usefixtures("offline_cache")  # tests/data/conftest.py


def refused(tmp_path, argv):
    """The one error line of a ``train`` (or other command) that must fail; checks no run folder appeared."""
    status, _, err = run_cli(argv)
    assert status == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tinygrad-caps "), err
    assert not (tmp_path / "run").exists()
    return lines[0]


def norb_folder(root, n_train=4, n_test=2):
    write_norb_split(root, "train", n_train)
    write_norb_split(root, "test", n_test, seed=1)
    return root


# ---------------------------------------------------------------- 1. smallNORB headers that overflow

HUGE_DIMS = [2 ** 31 - 1] * 4


@pytest.mark.parametrize("compress", [False, True])
def test_a_norb_header_declaring_exabytes_is_a_damaged_file_not_a_lack_of_memory(tmp_path, compress):
    data = norb_folder(tmp_path / "data")
    dat = data / f"{norb.SPLIT_PREFIX['train']}-dat.mat"
    raw = norb_header(0x1E3D4C55, 4, HUGE_DIMS) + bytes(100)
    dat.write_bytes(gzip.compress(raw) if compress else raw)
    line = refused(tmp_path, train_argv("smallnorb", data, tmp_path / "run"))
    assert str(dat) in line and "truncated or damaged" in line and "out of memory" not in line
    assert f"{(2 ** 31 - 1) ** 4:,} bytes" in line and "holds 100" in line


def test_a_gzip_stream_is_measured_before_it_is_called_too_big(tmp_path, monkeypatch):
    path = tmp_path / "m.mat.gz"
    path.write_bytes(gzip.compress(norb_bytes(np.zeros((50, 40), np.uint8))))
    monkeypatch.setattr(norb, "meminfo_available_bytes", lambda: 1000)  # 2000 bytes do not fit
    with pytest.raises(NORBError, match="2,000 bytes of data, more than the 1,000 bytes of memory available"):
        read_norb_matrix(path)
    path.write_bytes(gzip.compress(norb_bytes(np.zeros((50, 40), np.uint8))[:-1500]))
    with pytest.raises(NORBError, match="truncated or damaged.* the gzip stream holds 500"):
        read_norb_matrix(path)
    monkeypatch.setattr(norb, "meminfo_available_bytes", lambda: None)  # unknown: NumPy itself refuses 2^124 bytes
    path.write_bytes(gzip.compress(norb_header(0x1E3D4C55, 4, HUGE_DIMS) + bytes(10)))
    with pytest.raises(NORBError, match="truncated or damaged.* the gzip stream holds 10"):
        read_norb_matrix(path)


def test_a_raw_norb_file_is_checked_against_its_size_before_allocating(tmp_path, monkeypatch):
    path = tmp_path / "m.mat"
    path.write_bytes(norb_header(0x1E3D4C54, 2, [1000, 1000, 1]) + bytes(12))

    def no_allocation(*args, **kwargs):
        raise AssertionError("allocated before checking the file's size")

    monkeypatch.setattr(norb, "_allocate", no_allocation)
    with pytest.raises(NORBError, match=r"\(1000, 1000\) \(int32\) declares 4,000,000 bytes of data, the file holds"):
        read_norb_matrix(path)


# ---------------------------------------------------------------- 2. empty splits

@pytest.mark.parametrize("split", ["train", "test"])
def test_an_empty_smallnorb_split_is_refused(tmp_path, split):
    data = norb_folder(tmp_path / "data", **{f"n_{split}": 0})
    line = refused(tmp_path, train_argv("smallnorb", data, tmp_path / "run"))
    assert f"the {split} split of dataset 'smallnorb' holds no examples" in line
    assert f"{norb.SPLIT_PREFIX[split]}-dat.mat" in line


@pytest.mark.parametrize("dataset", ["mnist", "tiny"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_an_empty_idx_split_is_refused(tmp_path, dataset, split):
    counts = (0, 6) if split == "train" else (6, 0)
    write_striped_dataset(tmp_path / "data" / dataset, counts, size=28, cycle_labels=True)
    line = refused(tmp_path, train_argv(dataset, tmp_path / "data", tmp_path / "run"))
    assert f"the {split} split of dataset {dataset!r} holds no examples" in line
    assert ("train-" if split == "train" else "t10k-") in line


def test_a_spec_whose_loader_gives_nothing_is_refused_at_the_registry():
    spec = DatasetSpec("custom", ("a", "b"), 1, 4, UNIT_SCALE, UNIT_SCALE, None,
                       lambda split, d, dl: (np.zeros((0, 1, 4, 4), np.uint8), np.zeros(0, np.int64)))
    with pytest.raises(DatasetError, match="/somewhere: the test split of dataset 'custom' holds no examples"):
        spec.load("test", "/somewhere")


# ---------------------------------------------------------------- 3-5. image folders

def test_a_png_declaring_30000x30000_pixels_is_refused_naming_it(tmp_path):
    root = write_image_folder(tmp_path / "images")
    bomb = root / "train" / "a" / "bomb.png"
    bomb.write_bytes(png_header_only(30000, 30000))
    line = refused(tmp_path, train_argv("imagefolder", root, tmp_path / "run", "--image-size", "8"))
    assert str(bomb) in line and "decompression bomb" in line


def test_a_png_past_pillows_warning_limit_gives_no_warning_line(tmp_path):
    from PIL import Image

    root = write_image_folder(tmp_path / "images")
    (root / "train" / "a" / "large.png").write_bytes(png_header_only(10000, 10000))  # warned, then no pixels
    with warnings.catch_warnings(record=True) as caught:  # the console script would print a warning on stderr
        warnings.simplefilter("always")
        line = refused(tmp_path, train_argv("imagefolder", root, tmp_path / "run", "--image-size", "8"))
    assert "large.png: unreadable image" in line
    assert not [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]


def test_a_png_with_a_misread_chunk_is_refused_naming_it(tmp_path):
    root = write_image_folder(tmp_path / "images")
    broken = root / "test" / "b" / "0.png"
    raw = broken.read_bytes()
    length = struct.unpack(">I", raw[33:37])[0]  # the IDAT chunk's, 5 short: Pillow raises SyntaxError
    broken.write_bytes(raw[:33] + struct.pack(">I", length - 5) + raw[37:])
    line = refused(tmp_path, train_argv("imagefolder", root, tmp_path / "run", "--image-size", "8"))
    assert f"{broken}: unreadable image (broken PNG file" in line


@pytest.mark.parametrize("kind", ["symlink loop", "dangling symlink", "fifo", "folder"])
def test_an_image_that_is_not_a_readable_file_is_refused_not_skipped(tmp_path, kind):
    root = write_image_folder(tmp_path / "images")
    odd = root / "train" / "b" / "odd.png"
    if kind == "symlink loop":
        os.symlink(odd.name, odd)
    elif kind == "dangling symlink":
        os.symlink("nowhere.png", odd)
    elif kind == "folder":
        odd.mkdir()
    else:
        os.mkfifo(odd)
    line = refused(tmp_path, train_argv("imagefolder", root, tmp_path / "run", "--image-size", "8"))
    assert f"{odd}: unreadable image" in line


def test_an_image_folder_with_one_class_is_refused(tmp_path):
    root = write_image_folder(tmp_path / "images", classes=("only",))
    line = refused(tmp_path, train_argv("imagefolder", root, tmp_path / "run", "--image-size", "8"))
    assert "a single class folder (only)" in line and "at least 2" in line and str(root / "train") in line


def test_a_test_split_with_an_unknown_class_is_refused_before_anything_is_cached(tmp_path):
    root = write_image_folder(tmp_path / "images")
    (root / "test" / "z").mkdir()
    (root / "test" / "z" / "0.png").write_bytes((root / "test" / "a" / "0.png").read_bytes())
    line = refused(tmp_path, train_argv("imagefolder", root, tmp_path / "run", "--image-size", "8"))
    assert "class folder(s) z are not among the training classes" in line
    assert not list((tmp_path / "cache").rglob("*.npy"))


def test_a_data_dir_that_is_a_file_is_named_as_such(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a dataset")
    for dataset in ("fashion-mnist", "tiny", "imagefolder"):
        line = refused(tmp_path, train_argv(dataset, afile, tmp_path / "run"))
        assert f"--data-dir {afile} is a file, not a folder" in line


# ---------------------------------------------------------------- 6. a partial --data-dir, never the cache

@pytest.mark.parametrize("missing", ["training-cat", "testing split"])
def test_a_partial_smallnorb_data_dir_is_an_error_not_a_fallback_to_the_cache(tmp_path, missing):
    norb_folder(tmp_path / "cache" / "smallnorb")  # a complete copy that must not be used
    data = norb_folder(tmp_path / "data")
    for path in data.iterdir():
        if (missing == "training-cat" and "training-cat" in path.name) or \
                (missing == "testing split" and "testing" in path.name):
            path.unlink()
    line = refused(tmp_path, train_argv("smallnorb", data, tmp_path / "run"))
    assert f"{data} holds only part of dataset 'smallnorb'" in line
    assert ("training-cat.mat" if missing == "training-cat" else "testing-dat.mat") in line


def test_a_partial_cifar_folder_is_an_error_not_a_fallback_to_the_cached_archive(tmp_path):
    (tmp_path / "cache" / "cifar10").mkdir(parents=True)
    (tmp_path / "cache" / "cifar10" / cifar.ARCHIVE).write_bytes(cifar_archive(cifar_members(2)))
    extracted = tmp_path / "data" / "cifar-10-batches-bin"
    extracted.mkdir(parents=True)
    for name, data in cifar_members(2).items():
        if name != "data_batch_3.bin":
            (extracted / name).write_bytes(data)
    line = refused(tmp_path, train_argv("cifar10", tmp_path / "data", tmp_path / "run"))
    assert f"{extracted} holds only part of dataset 'cifar10': data_batch_3.bin missing" in line


def test_a_data_dir_without_any_of_the_files_still_finds_the_cache(tmp_path):
    norb_folder(tmp_path / "cache" / "smallnorb")
    (tmp_path / "empty").mkdir()
    status, out, err = run_cli(train_argv("smallnorb", tmp_path / "empty", tmp_path / "run"))
    assert status == 0, err
    assert "4 training and 2 test images" in out


# ---------------------------------------------------------------- 7. --image-size and out-of-memory messages

def test_an_image_size_whose_decoded_images_cannot_fit_is_refused_before_decoding(tmp_path, monkeypatch):
    root = write_image_folder(tmp_path / "images")
    monkeypatch.setattr(folder, "meminfo_available_bytes", lambda: 2 * 1024 ** 3)

    def no_decoding(*args):
        raise AssertionError("decoded before the size check")

    monkeypatch.setattr(folder, "_decode", no_decoding)
    line = refused(tmp_path, train_argv("imagefolder", root, tmp_path / "run", "--image-size", "100000"))
    assert "--image-size 100000" in line and "4 images" in line and "GiB of memory is available" in line
    needed = (4 * 3 + 3 + 4) * 100000 ** 2  # the 4 RGB images, and one in decoding (Pillow's RGBX and NumPy's RGB)
    assert f"need {needed / 1024 ** 3:,.1f} GiB, and 2.0 GiB" in line


def test_out_of_memory_never_has_an_empty_reason(tmp_path, monkeypatch):
    assert one_line(MemoryError()) == ("out of memory: MemoryError (an allocation failed); use a smaller model or "
                                       "--batch-size")
    from PIL import Image

    def exhausted(self, *args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(Image.Image, "resize", exhausted)
    root = write_image_folder(tmp_path / "images")
    line = refused(tmp_path, train_argv("imagefolder", root, tmp_path / "run", "--image-size", "8"))
    assert f"out of memory: decoding {root / 'train' / 'a' / '0.png'} into a 3x8x8 image" in line


# ---------------------------------------------------------------- 8. geometry mismatches name the checkpoint

@pytest.fixture
def checkpoint(tmp_path):
    write_striped_dataset(tmp_path / "idx" / "tiny", (8, 4), size=10, cycle_labels=True)
    status, _, err = run_cli(train_argv("tiny", tmp_path / "idx", tmp_path / "trained"))
    assert status == 0, err
    return tmp_path / "trained" / "checkpoints" / "last.npz"


@pytest.mark.parametrize("command", ["evaluate", "visualize"])
@pytest.mark.parametrize("dataset", ["smallnorb", "cifar10", "mnist"])
def test_a_checkpoint_for_other_images_names_both_geometries(tmp_path, checkpoint, command, dataset):
    argv = [command, "--checkpoint", str(checkpoint), "--dataset", dataset, "--device", "cpu"]
    if command == "visualize":
        argv += ["--what", "reconstructions", "--out", str(tmp_path / "picture.png")]
    line = refused(tmp_path, argv)
    assert "--image-size" not in line and "--channels" not in line
    assert f"checkpoint {checkpoint} takes 1x10x10 images in 3 classes" in line and f"dataset {dataset!r} gives" in line


# ---------------------------------------------------------------- 9. a failed download

def test_a_failed_mnist_download_leaves_no_folder_and_reads_as_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYGRAD_CAPS_OFFLINE", "0")

    def no_network(url, timeout=None):
        raise urllib.error.URLError(OSError(-2, "Name or service not known"))

    monkeypatch.setattr(cache.urllib.request, "urlopen", no_network)
    line = refused(tmp_path, ["train", "--dataset", "mnist", "--out", str(tmp_path / "run"), "--device", "cpu"])
    assert "Name or service not known" in line and "put the four files" in line
    assert ".;" not in line and "; into" not in line
    assert not (tmp_path / "cache" / "mnist").exists()


def test_download_messages_of_every_format_join_into_one_sentence_per_part():
    for load in (lambda: norb.load_smallnorb("test", download_missing=False),
                 lambda: cifar.load_cifar10("test", download_missing=False)):
        with pytest.raises(DatasetError) as info:
            load()
        line = one_line(info.value)
        assert "(downloads are off); put " in line and ".;" not in line, line
