"""IDX datasets (MNIST, Fashion-MNIST, or any folder of IDX files) and a seeded batch iterator.

Where the four files are looked for, in order:
    1. ``data_dir`` (the CLI's ``--data-dir``), and ``data_dir/<name>``;
    2. ``$TINYGRAD_CAPS_DATA/<name>``, else ``~/.cache/tinygrad-caps/<name>``;
    3. for Fashion-MNIST, the Debian package's folder ``/usr/share/datasets/fashion-mnist``
       (``apt-get install dataset-fashion-mnist``);
    4. a download from the standard public mirrors into folder 2, each file checked against the
       SHA-256 of its decompressed content and written atomically.
Offline with nothing found, the error names the four files and where to put them.
``TINYGRAD_CAPS_OFFLINE=1`` turns downloads off.
"""
from __future__ import annotations

import gzip
import hashlib
import math
import os
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
ALL_FILES = SPLIT_FILES["train"] + SPLIT_FILES["test"]

KNOWN = {
    "mnist": {
        "mirrors": ["https://ossci-datasets.s3.amazonaws.com/mnist/",
                    "https://storage.googleapis.com/cvdf-datasets/mnist/"],
        # SHA-256 of the decompressed files
        "sha256": {
            "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        },
        "system_dirs": [],
        "classes": [str(i) for i in range(10)],
    },
    "fashion-mnist": {
        "mirrors": ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"],
        "sha256": {
            "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        },
        "system_dirs": ["/usr/share/datasets/fashion-mnist"],
        "classes": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                    "Ankle boot"],
    },
}

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


class DatasetError(RuntimeError):
    """A dataset is missing, truncated, corrupt, or not an IDX file; the message says what to do."""


class IDXError(DatasetError, ValueError):
    """An IDX file's header or length is wrong."""


def _decompressed_bytes(path: Path) -> bytes:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise IDXError(f"{path}: the gzip stream is truncated or corrupt ({exc})") from exc
    return raw


def parse_idx(data: bytes, name: str = "<bytes>") -> np.ndarray:
    """Decode IDX bytes: validates the magic number, the dimensions and the exact length."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise IDXError(f"{name}: not an IDX file (bad magic number {data[:4].hex() or 'empty'})")
    type_code, ndim = data[2], data[3]
    if type_code not in _IDX_TYPES:
        raise IDXError(f"{name}: unknown IDX element type 0x{type_code:02x}")
    if ndim == 0 or len(data) < 4 + 4 * ndim:
        raise IDXError(f"{name}: IDX header with {ndim} dimensions is truncated")
    shape = tuple(int(n) for n in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[type_code])
    expected = 4 + 4 * ndim + math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise IDXError(f"{name}: {len(data)} bytes, but its header {shape} ({dtype}) needs {expected}: "
                       f"the file is {'truncated' if len(data) < expected else 'longer than its header says'}")
    return np.frombuffer(data, dtype=dtype, offset=4 + 4 * ndim).reshape(shape).astype(dtype.newbyteorder("="))


def read_idx(path) -> np.ndarray:
    """Read an IDX file, raw or gzip-compressed (detected from its first bytes)."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file")
    return parse_idx(_decompressed_bytes(path), str(path))


def write_idx(path, array, compress: bool = False) -> None:
    """Write ``array`` as an IDX file (uint8, int8, int16, int32, float32 or float64); for tests and tools."""
    array = np.asarray(array)
    codes = {np.dtype(v).newbyteorder("=") if np.dtype(v).itemsize > 1 else np.dtype(v): k for k, v in _IDX_TYPES.items()}
    code = codes.get(array.dtype)
    if code is None:
        raise ValueError(f"write_idx: unsupported dtype {array.dtype}")
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    data = header + array.astype(np.dtype(_IDX_TYPES[code])).tobytes()
    Path(path).write_bytes(gzip.compress(data) if compress else data)


def cache_root() -> Path:
    """``$TINYGRAD_CAPS_DATA`` or ``~/.cache/tinygrad-caps``."""
    return Path(os.environ.get("TINYGRAD_CAPS_DATA") or Path.home() / ".cache" / "tinygrad-caps")


def _find_file(folder: Path, stem: str):
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def candidate_dirs(name: str, data_dir=None) -> list[Path]:
    """The folders searched for ``name``'s files, in order."""
    dirs = []
    if data_dir is not None:
        dirs += [Path(data_dir), Path(data_dir) / name]
    dirs.append(cache_root() / name)
    dirs += [Path(d) for d in KNOWN.get(name, {}).get("system_dirs", [])]
    return dirs


def find_dataset_dir(name: str, data_dir=None):
    """The first folder holding all four IDX files of ``name`` (raw or .gz), or None."""
    for folder in candidate_dirs(name, data_dir):
        if all(_find_file(folder, stem) for stem in ALL_FILES):
            return folder
    return None


def download(name: str, target: Path) -> Path:
    """Fetch the four files of a known dataset into ``target`` (SHA-256 checked, atomic writes)."""
    info = KNOWN[name]
    target.mkdir(parents=True, exist_ok=True)
    for stem in ALL_FILES:
        if _find_file(target, stem):
            continue
        errors = []
        for mirror in info["mirrors"]:
            try:
                with urllib.request.urlopen(mirror + stem + ".gz", timeout=30) as response:
                    payload = response.read()
            except OSError as exc:
                errors.append(f"{mirror}: {exc}")
                continue
            digest = hashlib.sha256(gzip.decompress(payload)).hexdigest()
            if digest != info["sha256"][stem]:
                errors.append(f"{mirror}: SHA-256 mismatch ({digest})")
                continue
            fd, tmp = tempfile.mkstemp(dir=target, prefix=".download-")
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target / f"{stem}.gz")
            break
        else:
            raise DatasetError(f"could not download {stem}.gz for {name}: " + "; ".join(errors))
    return target


def _missing_message(name: str, data_dir, reason: str) -> str:
    files = ", ".join(f"{stem}[.gz]" for stem in ALL_FILES)
    where = Path(data_dir) if data_dir is not None else cache_root() / name
    hint = "\n  or install the Debian package: apt-get install dataset-fashion-mnist" if name == "fashion-mnist" else ""
    return (f"dataset {name!r} not found ({reason}).\n  Put the four files {files}\n  into {where} "
            f"(or pass --data-dir){hint}")


def downloads_allowed() -> bool:
    """False when ``$TINYGRAD_CAPS_OFFLINE`` is 1 (tests and offline machines set it)."""
    return os.environ.get("TINYGRAD_CAPS_OFFLINE", "0") != "1"


def load_dataset(name: str, split: str = "train", data_dir=None, download_missing: bool | None = None):
    """Images and labels of one split.

    Args:
        name: "mnist", "fashion-mnist", or any name whose four IDX files are in ``data_dir``.
        split: "train" or "test".
        download_missing: fetch a known dataset that no folder holds (default: unless
            ``$TINYGRAD_CAPS_OFFLINE=1``).
    Returns:
        (images, labels): uint8 (N, C, H, W) (C = 1 for 3-D IDX files) and int64 (N,).
    """
    if split not in SPLIT_FILES:
        raise ValueError(f"load_dataset: split must be 'train' or 'test', got {split!r}")
    folder = find_dataset_dir(name, data_dir)
    if folder is None:
        if name not in KNOWN:
            raise DatasetError(_missing_message(name, data_dir, "not a known dataset, and no folder holds its files"))
        if not (downloads_allowed() if download_missing is None else download_missing):
            raise DatasetError(_missing_message(name, data_dir, "downloads are off"))
        try:
            folder = download(name, cache_root() / name)
        except DatasetError as exc:
            raise DatasetError(_missing_message(name, data_dir, f"offline or the mirrors failed: {exc}")) from exc
    image_stem, label_stem = SPLIT_FILES[split]
    images = read_idx(_find_file(folder, image_stem))
    labels = read_idx(_find_file(folder, label_stem))
    if images.ndim == 3:
        images = images[:, None]
    if images.ndim != 4 or labels.ndim != 1 or len(images) != len(labels):
        raise DatasetError(f"{folder}: {split} images {images.shape} and labels {labels.shape} do not match")
    if images.dtype != np.uint8:
        raise DatasetError(f"{folder}: expected uint8 images, got {images.dtype}")
    return images, labels.astype(np.int64)


def load_mnist(split: str = "train", data_dir=None, download_missing: bool | None = None):
    """MNIST images (N, 1, 28, 28) uint8 and labels (N,) int64; see ``load_dataset``."""
    return load_dataset("mnist", split, data_dir, download_missing)


def load_fashion_mnist(split: str = "train", data_dir=None, download_missing: bool | None = None):
    """Fashion-MNIST images (N, 1, 28, 28) uint8 and labels (N,) int64; see ``load_dataset``."""
    return load_dataset("fashion-mnist", split, data_dir, download_missing)


AUGMENTATIONS = (None, "none", "shift", "shift+flip")


def shift_images(images: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """Translate each (C, H, W) image by its (dy, dx) with zero fill; images (N, C, H, W)."""
    out = np.zeros_like(images)
    h, w = images.shape[2:]
    for k, (dy, dx) in enumerate(shifts):
        ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
        xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
        out[k, :, yd, xd] = images[k, :, ys, xs]
    return out


class BatchIterator:
    """Batches of (float32 images in [0, 1] (B, C, H, W), int64 labels (B,)).

    Shuffling and augmentation are drawn from a generator seeded by (seed, epoch, batch index),
    so any epoch and any batch can be reproduced exactly, after a resume too. ``augment`` is
    None, "shift" (random shift up to ``max_shift`` pixels, zero padding, as in the paper) or
    "shift+flip" (also a horizontal flip with probability 1/2). Use it for training data only.
    """

    def __init__(self, images, labels, batch_size: int, shuffle: bool = False, augment=None, seed: int = 0,
                 max_shift: int = 2, drop_last: bool = False):
        if batch_size < 1:
            raise ValueError(f"BatchIterator: batch_size must be positive, got {batch_size}")
        if augment not in AUGMENTATIONS:
            raise ValueError(f"BatchIterator: augment must be one of {AUGMENTATIONS}, got {augment!r}")
        if len(images) != len(labels):
            raise ValueError(f"BatchIterator: {len(images)} images but {len(labels)} labels")
        self.images, self.labels = images, labels
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.augment = None if augment == "none" else augment
        self.max_shift, self.drop_last = max_shift, drop_last
        self.epoch = 0

    def __len__(self):
        n = len(self.images)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle and augmentation the next iteration reproduces."""
        self.epoch = epoch

    def order(self) -> np.ndarray:
        n = len(self.images)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, self.epoch]).permutation(n)

    def batches(self, start: int = 0):
        """Yield batches ``start``, ``start + 1``, ... of the current epoch."""
        order = self.order()
        for index in range(start, len(self)):
            picked = order[index * self.batch_size:(index + 1) * self.batch_size]
            images = self.images[picked]
            if self.augment:
                rng = np.random.default_rng([self.seed, self.epoch, index, 1])
                shifts = rng.integers(-self.max_shift, self.max_shift + 1, size=(len(picked), 2))
                images = shift_images(images, shifts)
                if self.augment == "shift+flip":
                    flip = rng.random(len(picked)) < 0.5
                    images[flip] = images[flip, ..., ::-1]
            yield images.astype(np.float32) / 255.0, self.labels[picked]

    def __iter__(self):
        return self.batches()
