"""A fuzz suite for the dataset formats: smallNORB files (magic number, dimension count, sizes,
truncation, gzip), CIFAR-10 binary batches and archives (truncated, wrong record size, bad labels,
missing members) and image folders (empty, one class, damaged or huge-header PNGs, symlink loops,
non-images), each run through ``cli.main(["train", ...])`` in-process on a tiny CapsNet. The
property, for every case: exit status 0 with the right image counts on valid input, else 2 with
exactly one line on stderr and no traceback; and a `train` that fails creates no run folder.

Each family draws about ``FACTOR`` times the profile's ``max_examples`` (12 by default: 36 per
family; ``HYPOTHESIS_PROFILE=long``: 900), shared among its kinds of damage, each one a test of its
own so that every run tries every kind. ``pytest --hypothesis-show-statistics`` shows how each run
ended (the ``exit`` events).
"""
import gzip
import io
import math
import os
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from cli_fuzz import assert_clean_ending
from dataset_files import (cifar_archive, cifar_members, data_cache, norb_bytes, norb_split_files, png_header_only,
                           png_image, run_cli, train_argv)
from tinygrad_caps.data import cifar, norb

pytest.importorskip("PIL")

FACTOR = 3
EXAMPLES = settings.default.max_examples * FACTOR


def check_run(argv, out, valid, counts):
    """Run ``argv``; the property above, with ``counts`` = (training, test) images on valid input."""
    status, stdout, err = run_cli(argv)
    assert_clean_ending(status, err, valid)
    assert "out of memory" not in err  # tiny files: whatever they declare, they are damaged, not too big
    assert out.exists() == valid  # a run that failed before its first batch leaves no folder
    if valid:
        assert f"{counts[0]} training and {counts[1]} test images" in stdout, stdout
        assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def write_files(folder: Path, files: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, raw in files.items():
        (folder / name).write_bytes(raw)


# ---------------------------------------------------------------- smallNORB

NORB_COUNTS = {"train": 4, "test": 2}
VALID_NORB = {**norb_split_files("train", NORB_COUNTS["train"]), **norb_split_files("test", NORB_COUNTS["test"], 1)}
NORB_DTYPES = {0x1E3D4C51: "<f4", 0x1E3D4C53: "<f8", 0x1E3D4C54: "<i4", 0x1E3D4C55: "u1", 0x1E3D4C56: "<i2"}


def decode_norb(raw: bytes):
    """The array a NORB binary-matrix file holds, or None if it is not a valid (possibly gzipped) one
    (an oracle written from the format's description, not from the loader)."""
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except Exception:  # noqa: BLE001  (any failure means: not valid)
            return None
    if len(raw) < 8:
        return None
    magic, ndim = struct.unpack("<Ii", raw[:8])
    if magic not in NORB_DTYPES or not 1 <= ndim <= 16 or len(raw) < 8 + 4 * max(3, ndim):
        return None
    dims = struct.unpack(f"<{max(3, ndim)}i", raw[8:8 + 4 * max(3, ndim)])
    dtype, offset = np.dtype(NORB_DTYPES[magic]), 8 + 4 * max(3, ndim)
    if min(dims) < 0 or len(raw) - offset != math.prod(dims[:ndim]) * dtype.itemsize:
        return None
    return np.frombuffer(raw, dtype, offset=offset).reshape(dims[:ndim])


def norb_counts(files: dict):
    """(training, test) image counts if `train` must accept these smallNORB files, else None."""
    counts = []
    for split, prefix in norb.SPLIT_PREFIX.items():
        dat, cat = (files.get(f"{prefix}-{kind}.mat") for kind in ("dat", "cat"))
        if dat is None or cat is None:
            return None
        images, labels = decode_norb(dat), decode_norb(cat)
        if images is None or labels is None or images.dtype != np.uint8 or images.shape[1:] != (2, 96, 96):
            return None
        if labels.dtype != np.dtype("<i4") or labels.shape != (len(images),) or len(images) == 0:
            return None
        if labels.min() < 0 or labels.max() > 4:
            return None
        if f"{prefix}-info.mat" in files:
            info = decode_norb(files[f"{prefix}-info.mat"])
            if info is None or info.shape != (len(images), 4):
                return None
        counts.append(len(images))
    return tuple(counts)


def _set_int32(raw: bytes, at: int, value: int) -> bytes:
    return raw[:at] + struct.pack("<i", value) + raw[at + 4:] if at + 4 <= len(raw) else raw


NORB_KINDS = ("none", "magic", "ndim", "dim", "dims overflow", "truncate", "extend", "gzip", "gzip truncated",
              "missing", "empty split", "label")


@st.composite
def norb_dataset(draw, kind):
    """The valid smallNORB files with one of them re-headed, truncated, extended, compressed, relabelled
    or removed, or one split emptied (``kind``)."""
    files = dict(VALID_NORB)
    name = draw(st.sampled_from(sorted(files)))
    raw = files[name]
    if kind == "magic":
        raw = _set_int32(raw, 0, draw(st.sampled_from(sorted(NORB_DTYPES) + [0, 0x1E3D4C52, -1])))
    elif kind == "ndim":
        raw = _set_int32(raw, 4, draw(st.integers(-1, 18)))
    elif kind == "dim":
        value = draw(st.one_of(st.sampled_from([0, 1, 2, 95, 96, 2 ** 31 - 1, -1, -2 ** 31]), st.integers(0, 300)))
        raw = _set_int32(raw, 8 + 4 * draw(st.integers(0, 3)), value)
    elif kind == "dims overflow":  # their product overflows 64 bits
        for at in range(8, 8 + 4 * max(3, struct.unpack("<i", raw[4:8])[0]), 4):
            raw = _set_int32(raw, at, 2 ** 31 - 1)
    elif kind == "truncate":
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif kind == "extend":
        raw = raw + draw(st.binary(min_size=1, max_size=8))
    elif kind in ("gzip", "gzip truncated"):
        raw = gzip.compress(raw)
        if kind == "gzip truncated":
            raw = raw[:draw(st.integers(0, len(raw) - 1))]
        files[name + ".gz"] = raw
        del files[name]
        return files
    elif kind == "label":
        name = f"{name.rsplit('-', 1)[0]}-cat.mat"
        labels = decode_norb(files[name]).copy()
        labels[draw(st.integers(0, len(labels) - 1))] = draw(st.integers(-3, 8))
        raw = norb_bytes(labels)
    elif kind == "missing":
        del files[name]
        return files
    elif kind == "empty split":
        prefix = norb.SPLIT_PREFIX[draw(st.sampled_from(sorted(norb.SPLIT_PREFIX)))]
        files[f"{prefix}-dat.mat"] = norb_bytes(np.zeros((0, 2, 96, 96), np.uint8))
        files[f"{prefix}-cat.mat"] = norb_bytes(np.zeros(0, np.int32))
        files[f"{prefix}-info.mat"] = norb_bytes(np.zeros((0, 4), np.int32))
        return files
    files[name] = raw
    return files


@pytest.mark.parametrize("kind", NORB_KINDS)
@settings(max_examples=max(1, EXAMPLES // len(NORB_KINDS)))
@given(data=st.data())
def test_smallnorb_files_end_in_one_line_or_train(kind, data):
    files = data.draw(norb_dataset(kind))
    with tempfile.TemporaryDirectory() as tmp, data_cache(Path(tmp) / "cache"):
        write_files(Path(tmp) / "data", files)
        out = Path(tmp) / "run"
        counts = norb_counts({name.removesuffix(".gz"): raw for name, raw in files.items()})
        check_run(train_argv("smallnorb", Path(tmp) / "data", out), out, counts is not None, counts)


# ---------------------------------------------------------------- CIFAR-10

PER_BATCH = 2
VALID_MEMBERS = cifar_members(PER_BATCH)


def cifar_counts(members: dict):
    """(training, test) image counts if `train` must accept these batches, else None (the format:
    whole 3073-byte records, at least one, each label byte 0..9)."""
    counts = []
    for names in (cifar.SPLIT_MEMBERS["train"], cifar.SPLIT_MEMBERS["test"]):
        total = 0
        for name in names:
            data = members.get(name)
            if not data or len(data) % 3073 or max(data[::3073]) > 9:
                return None
            total += len(data) // 3073
        counts.append(total)
    return tuple(counts)


CIFAR_KINDS = ("none", "truncate", "extend", "label", "pixel", "missing", "archive cut", "not an archive",
               "extra member")


@st.composite
def cifar_dataset(draw, kind):
    """(layout, members, archive bytes or None, valid): the six batches with one truncated, extended,
    relabelled, repainted or removed, as an archive (or one cut short, replaced, or with an extra
    member: ``kind``) or as extracted files."""
    members = dict(VALID_MEMBERS)
    layout = "archive" if kind in ("archive cut", "not an archive", "extra member") else \
        draw(st.sampled_from(["archive", "folder"]))
    event(f"cifar {layout}")
    name = draw(st.sampled_from(sorted(members)))
    data = members[name]
    if kind == "truncate":
        members[name] = data[:len(data) - draw(st.integers(1, len(data)))]
    elif kind == "extend":  # whole records (their label byte 0..12) or a few stray bytes
        records = np.random.default_rng(draw(st.integers(0, 99))).integers(0, 256, (draw(st.integers(1, 2)), 3073))
        records[:, 0] = draw(st.integers(0, 12))
        members[name] = data + draw(st.sampled_from([records.astype(np.uint8).tobytes()])
                                    | st.binary(min_size=1, max_size=10))
    elif kind in ("label", "pixel"):
        record = draw(st.integers(0, PER_BATCH - 1))
        at = 3073 * record + (0 if kind == "label" else draw(st.integers(1, 3072)))
        members[name] = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    elif kind == "missing":
        del members[name]
    archive = None
    if layout == "archive":
        archive = cifar_archive(dict(members, **({"readme.txt": b"hello"} if kind == "extra member" else {})))
        if kind == "archive cut":  # noise does not compress: the first half of the archive lacks some batch
            archive = archive[:draw(st.integers(0, len(archive) // 2))]
        elif kind == "not an archive":
            archive = draw(st.binary(max_size=64))
    intact = kind not in ("archive cut", "not an archive")
    return layout, members, archive, intact and cifar_counts(members) is not None


@pytest.mark.parametrize("kind", CIFAR_KINDS)
@settings(max_examples=max(1, EXAMPLES // len(CIFAR_KINDS)))
@given(data=st.data())
def test_cifar10_batches_and_archives_end_in_one_line_or_train(kind, data):
    layout, members, archive, valid = data.draw(cifar_dataset(kind))
    with tempfile.TemporaryDirectory() as tmp, data_cache(Path(tmp) / "cache"):
        folder = Path(tmp) / "data"
        if layout == "archive":
            write_files(folder, {cifar.ARCHIVE: archive})
        else:
            write_files(folder / "cifar-10-batches-bin", members)
        out = Path(tmp) / "run"
        check_run(train_argv("cifar10", folder, out), out, valid, valid and cifar_counts(members))


# ---------------------------------------------------------------- image folders

CLASSES, PER_CLASS = ("a", "b", "c"), {"train": 2, "test": 1}
LOOP, DANGLING, FOLDER = object(), object(), object()  # entries that are not image bytes


def valid_folder() -> dict:
    """{relative path: PNG bytes} of a valid image folder, 3 classes, 6 training and 3 test images."""
    return {f"{split}/{name}/{k}.png": png_image(9, 7, seed=10 * c + k)
            for split, count in PER_CLASS.items() for c, name in enumerate(CLASSES) for k in range(count)}


VALID_FOLDER = valid_folder()


def pillow_decodes(raw: bytes) -> bool:
    """Whether Pillow itself decodes ``raw`` (the oracle for byte flips, which PNG's CRCs may not see)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as image:
            image.convert("RGB").load()
        return True
    except Exception:  # noqa: BLE001  (any failure means: not an image)
        return False


FOLDER_KINDS = ("none", "no classes", "no test split", "one class", "empty class", "test lacks a class",
                "unknown test class", "truncated png", "flipped byte", "short chunk", "huge header", "symlink loop",
                "dangling symlink", "not an image", "other files", "other sizes")


@st.composite
def image_folder(draw, kind):
    """(entries, valid, (training, test) counts): the valid folder emptied, cut to one class, or with
    an image damaged, given a huge header, replaced by a symlink loop or a non-image, or harmless
    extras (``kind``)."""
    entries = dict(VALID_FOLDER)
    victim = draw(st.sampled_from(sorted(entries)))
    counts, valid = (6, 3), kind in ("none", "test lacks a class", "other files", "other sizes")
    if kind == "no classes":
        entries = {path: raw for path, raw in entries.items() if not path.startswith("train/")}
        entries["train"] = FOLDER
    elif kind == "no test split":
        entries = {path: raw for path, raw in entries.items() if not path.startswith("test/")}
    elif kind == "one class":
        entries = {path: raw for path, raw in entries.items() if path.split("/")[1] == "a"}
    elif kind == "empty class":
        folder = victim.rsplit("/", 1)[0]
        entries = {path: raw for path, raw in entries.items() if not path.startswith(folder + "/")}
        entries[folder] = FOLDER
    elif kind == "test lacks a class":
        entries = {path: raw for path, raw in entries.items() if not path.startswith("test/c/")}
        counts = (6, 2)
    elif kind == "unknown test class":
        entries["test/zzz/0.png"] = VALID_FOLDER["test/a/0.png"]
    elif kind == "truncated png":  # noise does not compress: a cut in the first half of the file loses rows
        entries[victim] = entries[victim][:draw(st.integers(0, len(entries[victim]) // 2))]
    elif kind == "flipped byte":
        raw = entries[victim]
        at = draw(st.integers(0, len(raw) - 1))
        entries[victim] = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1:]
        valid = pillow_decodes(entries[victim])
    elif kind == "short chunk":  # the IDAT chunk's length field (bytes 33..36) understated: a misread chunk
        raw = entries[victim]
        length = struct.unpack(">I", raw[33:37])[0] - draw(st.integers(1, 100))
        entries[victim] = raw[:33] + struct.pack(">I", length) + raw[37:]
        valid = pillow_decodes(entries[victim])
    elif kind == "huge header":
        side = draw(st.sampled_from([30000, 20000, 10000, 65535, 1]))
        entries[victim] = png_header_only(side, draw(st.sampled_from([side, 1])))
    elif kind == "symlink loop":
        entries[victim] = LOOP
    elif kind == "dangling symlink":
        entries[victim] = DANGLING
    elif kind == "not an image":
        entries[victim] = b"not an image\n" * draw(st.integers(0, 3))
    elif kind == "other files":  # ignored: not named like an image, or a folder inside a class folder
        folder = victim.rsplit("/", 1)[0]
        entries[f"{folder}/notes.txt"] = draw(st.binary(max_size=20))
        entries[f"{folder}/nested"] = FOLDER
    elif kind == "other sizes":
        mode = draw(st.sampled_from(["L", "RGB", "RGBA"]))
        entries[victim] = png_image(draw(st.integers(1, 30)), draw(st.integers(1, 30)), seed=99, mode=mode)
    return entries, valid, counts


def write_entries(root: Path, entries: dict) -> None:
    for relative, content in entries.items():
        path = root / relative
        if content is FOLDER:
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is LOOP:
            os.symlink(path.name, path)
        elif content is DANGLING:
            os.symlink("nowhere.png", path)
        else:
            path.write_bytes(content)


@pytest.mark.parametrize("kind", FOLDER_KINDS)
@settings(max_examples=max(1, EXAMPLES // len(FOLDER_KINDS)))
@given(data=st.data(), channels=st.sampled_from(["1", "3"]))
def test_image_folders_end_in_one_line_or_train(kind, data, channels):
    entries, valid, counts = data.draw(image_folder(kind))
    with tempfile.TemporaryDirectory() as tmp, data_cache(Path(tmp) / "cache"):
        root = Path(tmp) / "images"
        write_entries(root, entries)
        out = Path(tmp) / "run"
        argv = train_argv("imagefolder", root, out, "--image-size", "8", "--channels", channels)
        check_run(argv, out, valid, counts)
