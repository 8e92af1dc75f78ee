"""CIFAR-10, binary version (``cifar-10-binary.tar.gz``), read with ``tarfile`` and NumPy (never pickle).

Each ``.bin`` member is a sequence of 3073-byte records: one label byte (0..9), then the 1024-byte
R, G and B planes of a 32x32 image, row-major. Training data is ``data_batch_1.bin`` ..
``data_batch_5.bin``, test data ``test_batch.bin``. The archive's SHA-256 and size are the ones
published in the TensorFlow Datasets checksum list (``tensorflow_datasets/url_checksums/cifar10.txt``).
"""
from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np

from .cache import cache_root, downloads_allowed, fetch_verified, search_dirs
from .errors import CORRUPT_STREAM_ERRORS, DatasetError

ARCHIVE = "cifar-10-binary.tar.gz"
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
ARCHIVE_SIZE = 170052171
ARCHIVE_SHA256 = "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
SPLIT_MEMBERS = {"train": tuple(f"data_batch_{k}.bin" for k in range(1, 6)), "test": ("test_batch.bin",)}
RECORD_BYTES = 1 + 3 * 32 * 32


def parse_cifar_records(data: bytes, name: str = "<bytes>"):
    """Decode CIFAR-10 binary records: returns uint8 images (N, 3, 32, 32) and int64 labels (N,).

    Raises DatasetError naming ``name`` when the length is not a whole number of records or a
    label is not in 0..9.
    """
    if len(data) == 0 or len(data) % RECORD_BYTES:
        raise DatasetError(f"{name}: {len(data)} bytes is not a whole number of {RECORD_BYTES}-byte CIFAR-10 "
                           f"records (truncated or not a CIFAR-10 binary batch)")
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    labels = records[:, 0].astype(np.int64)
    bad = np.flatnonzero(labels >= len(CLASSES))
    if bad.size:
        raise DatasetError(f"{name}: label {int(labels[bad[0]])} of record {int(bad[0])} is out of range 0..9")
    return records[:, 1:].reshape(-1, 3, 32, 32).copy(), labels


def read_cifar_archive(path, split: str):
    """Read ``split``'s batches out of the binary archive at ``path`` (members matched by file name,
    whatever folder they are in). Returns uint8 (N, 3, 32, 32) and int64 (N,)."""
    path = Path(path)
    try:
        with tarfile.open(path, "r:*") as archive:
            members = {Path(m.name).name: m for m in archive.getmembers() if m.isfile()}
            missing = [name for name in SPLIT_MEMBERS[split] if name not in members]
            if missing:
                raise DatasetError(f"{path}: the archive lacks {', '.join(missing)}")
            parts = [parse_cifar_records(archive.extractfile(members[name]).read(), f"{path}:{name}")
                     for name in SPLIT_MEMBERS[split]]
    except (tarfile.TarError, *CORRUPT_STREAM_ERRORS) as exc:
        raise DatasetError(f"{path}: not a readable tar archive ({exc})") from exc
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _find_source(split: str, data_dir):
    """The archive, or a folder of extracted ``.bin`` files, in the searched folders; or None.

    A folder given as ``data_dir`` (or its ``cifar10`` subfolder) holding some extracted ``.bin``
    files but not all of ``split``'s is an error (DatasetError naming the missing ones), never a
    reason to fall through to another copy.
    """
    user_folders = () if data_dir is None else (Path(data_dir), Path(data_dir) / "cifar10")
    every_member = SPLIT_MEMBERS["train"] + SPLIT_MEMBERS["test"]
    for folder in search_dirs("cifar10", data_dir):
        if (folder / ARCHIVE).is_file():
            return folder / ARCHIVE
        candidates = (folder, folder / "cifar-10-batches-bin")
        for extracted in candidates:
            if all((extracted / name).is_file() for name in SPLIT_MEMBERS[split]):
                return extracted
        for extracted in candidates if folder in user_folders else ():
            if any((extracted / name).is_file() for name in every_member):
                missing = ", ".join(name for name in SPLIT_MEMBERS[split] if not (extracted / name).is_file())
                raise DatasetError(f"{extracted} holds only part of dataset 'cifar10': {missing} missing ({split} "
                                   f"split; or put {ARCHIVE} there)")
    return None


def load_cifar10(split: str = "train", data_dir=None, download_missing: bool | None = None):
    """CIFAR-10 from ``cifar-10-binary.tar.gz`` (or its extracted ``.bin`` files).

    Returns:
        (images, labels): uint8 (N, 3, 32, 32) and int64 (N,) (50000 train, 10000 test).
    """
    if split not in SPLIT_MEMBERS:
        raise ValueError(f"load_cifar10: split must be 'train' or 'test', got {split!r}")
    source = _find_source(split, data_dir)
    if source is None:
        hint = _hint(data_dir)
        _check_downloadable(data_dir, download_missing)
        try:
            source = download_cifar10(cache_root() / "cifar10")
        except DatasetError as exc:
            raise DatasetError(f"dataset 'cifar10' not found (offline or the download failed: {exc})\n{hint}") from exc
    if source.is_dir():
        parts = [parse_cifar_records((source / name).read_bytes(), str(source / name)) for name in SPLIT_MEMBERS[split]]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    return read_cifar_archive(source, split)


def check_cifar10_available(split: str = "train", data_dir=None, download_missing: bool | None = None) -> None:
    """DatasetError, as loading would raise it, where no searched folder holds ``split`` of CIFAR-10
    and it may not be downloaded; nothing is read or downloaded."""
    if _find_source(split, data_dir) is None:
        _check_downloadable(data_dir, download_missing)


def _hint(data_dir) -> str:
    where = Path(data_dir) if data_dir is not None else cache_root() / "cifar10"
    return f"  put {ARCHIVE} (from {URL}) into {where} (or pass --data-dir)"  # read after "; " by the CLI


def _check_downloadable(data_dir, download_missing) -> None:
    """DatasetError where CIFAR-10 is missing and downloads are off."""
    if not (downloads_allowed() if download_missing is None else download_missing):
        raise DatasetError(f"dataset 'cifar10' not found (downloads are off)\n{_hint(data_dir)}")


def download_cifar10(target: Path) -> Path:
    """Fetch the archive into ``target`` (size and SHA-256 checked, written atomically); returns its path."""

    def checked_size(payload):
        if len(payload) != ARCHIVE_SIZE:
            raise OSError(f"{ARCHIVE} has {len(payload)} bytes, expected {ARCHIVE_SIZE}")
        return payload

    return fetch_verified([URL], target / ARCHIVE, ARCHIVE_SHA256, digest_of=checked_size, timeout=300)
