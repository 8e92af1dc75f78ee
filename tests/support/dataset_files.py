"""Tiny datasets in the formats the loaders read (smallNORB, CIFAR-10 binary, image folders), valid
or damaged, for the tests that feed them to ``tinygrad-caps train``; and that command run in-process."""
import contextlib
import io
import os
import struct
import tarfile
import zlib
from pathlib import Path

import numpy as np

from tinygrad_caps.data import cifar, norb
from tinygrad_caps.models import cli

# A CapsNet small enough that one epoch on a few images takes well under a second.
TINY_MODEL = ["--conv1-channels", "2", "--primary-types", "1", "--primary-dim", "2", "--digit-dim", "2",
              "--kernel-size", "3", "--decoder-hidden", "16,32", "--batch-size", "4",
              "--epochs", "1", "--no-progress", "--device", "cpu"]


def run_cli(argv):
    """(exit status, stdout, stderr) of ``cli.main(argv)`` in this process, argparse's SystemExit included."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            status = cli.main(argv)
        except SystemExit as exc:
            status = exc.code
    return status, out.getvalue(), err.getvalue()


def train_argv(dataset, data_dir, out, *extra):
    """``train`` of the tiny CapsNet on ``dataset`` in ``data_dir``, writing to ``out``."""
    return ["train", "--dataset", dataset, "--data-dir", str(data_dir), "--out", str(out), *TINY_MODEL, *extra]


@contextlib.contextmanager
def data_cache(path):
    """``$TINYGRAD_CAPS_DATA`` set to ``path`` inside the block (a per-example cache; Hypothesis
    examples share one pytest fixture, so monkeypatch cannot scope this)."""
    before = os.environ.get("TINYGRAD_CAPS_DATA")
    os.environ["TINYGRAD_CAPS_DATA"] = str(path)
    try:
        yield Path(path)
    finally:
        if before is None:
            del os.environ["TINYGRAD_CAPS_DATA"]
        else:
            os.environ["TINYGRAD_CAPS_DATA"] = before


# ---------------------------------------------------------------- smallNORB

def norb_bytes(array) -> bytes:
    """``array`` as a NORB binary matrix (what ``write_norb_matrix`` writes, uncompressed)."""
    array = np.asarray(array)
    codes = {dtype.newbyteorder("="): magic for magic, dtype in norb.NORB_TYPES.items()}
    magic = codes[array.dtype.newbyteorder("=")]
    dims = list(array.shape) + [1] * max(0, 3 - array.ndim)
    return np.asarray([magic, array.ndim] + dims, "<u4").tobytes() + array.astype(norb.NORB_TYPES[magic]).tobytes()


def norb_split_files(split, n, seed=0) -> dict:
    """{file name: bytes} of a smallNORB split of ``n`` random stereo pairs (labels 0, 1, ... mod 5)."""
    rng = np.random.default_rng(seed)
    prefix = norb.SPLIT_PREFIX[split]
    return {f"{prefix}-dat.mat": norb_bytes(rng.integers(0, 256, (n, 2, 96, 96), dtype=np.uint8)),
            f"{prefix}-cat.mat": norb_bytes(np.arange(n, dtype=np.int32) % 5),
            f"{prefix}-info.mat": norb_bytes(rng.integers(0, 9, (n, 4)).astype(np.int32))}


def write_norb_split(folder, split, n, seed=0):
    """Write ``norb_split_files`` into ``folder`` (created); returns ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, raw in norb_split_files(split, n, seed).items():
        (folder / name).write_bytes(raw)
    return folder


def norb_header(magic, ndim, dims) -> bytes:
    """A NORB header: magic, dimension count, then the given sizes (little-endian 32-bit)."""
    return struct.pack(f"<Ii{len(dims)}i", magic, ndim, *dims)


# ---------------------------------------------------------------- CIFAR-10

def cifar_batch(n, seed=0) -> bytes:
    """``n`` CIFAR-10 records (labels 0, 1, ... mod 10, random pixels)."""
    records = np.random.default_rng(seed).integers(0, 256, (n, cifar.RECORD_BYTES), dtype=np.uint8)
    records[:, 0] = np.arange(n) % 10
    return records.tobytes()


def cifar_members(per_batch) -> dict:
    """{member name: bytes} of the six batches, ``per_batch`` records each."""
    names = cifar.SPLIT_MEMBERS["train"] + cifar.SPLIT_MEMBERS["test"]
    return {name: cifar_batch(per_batch, seed=k) for k, name in enumerate(names)}


def cifar_archive(members: dict) -> bytes:
    """A ``cifar-10-binary.tar.gz`` holding ``members`` under ``cifar-10-batches-bin/``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# ---------------------------------------------------------------- image folders

def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width, height) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` RGB pixels and that holds no pixel data."""
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + png_chunk(b"IEND", b""))


def png_image(width, height, seed=0, mode="RGB") -> bytes:
    """A PNG of random pixels (noise does not compress, so a cut anywhere in its data loses rows)."""
    from PIL import Image

    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode).save(buffer, format="PNG")
    return buffer.getvalue()


def write_image_folder(root, classes=("a", "b"), per_class=(2, 1), size=(9, 7)):
    """``root/{train,test}/<class>/<k>.png``, ``per_class`` images per class in each split; returns ``root``."""
    root = Path(root)
    for split, count in zip(("train", "test"), per_class):
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for k in range(count):
                (root / split / name / f"{k}.png").write_bytes(png_image(*size, seed=10 * c + k))
    return root

