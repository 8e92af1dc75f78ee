"""smallNORB (LeCun et al. 2004): the NORB binary-matrix format and the dataset's loader.

The format: a little-endian int32 magic number giving the element type (0x1E3D4C55 uint8,
0x1E3D4C54 int32; also 0x1E3D4C51 float32, 0x1E3D4C53 float64, 0x1E3D4C56 int16), an int32 count of
dimensions, then max(3, ndim) int32 dimension sizes (the unused ones are 1), then the data.

The six official files (raw or ``.gz``) are checked element type, shape, length and label range;
downloads are checked against the SHA-256 and size of each ``.gz`` file as published in the
TensorFlow Datasets checksum list (``tensorflow_datasets/url_checksums/smallnorb.txt``).
"""
from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np

from .cache import cache_root, downloads_allowed, fetch_verified, find_file, search_dirs
from .errors import CORRUPT_STREAM_ERRORS, DatasetError
from .idx import READ_CHUNK, meminfo_available_bytes
from .labels import require_examples
from .transforms import downsample_by_mean

NORB_TYPES = {0x1E3D4C51: np.dtype("<f4"), 0x1E3D4C53: np.dtype("<f8"), 0x1E3D4C54: np.dtype("<i4"),
              0x1E3D4C55: np.dtype("u1"), 0x1E3D4C56: np.dtype("<i2")}

CLASSES = ("animal", "human", "airplane", "truck", "car")
SPLIT_PREFIX = {"train": "smallnorb-5x46789x9x18x6x2x96x96-training",
                "test": "smallnorb-5x01235x9x18x6x2x96x96-testing"}
MIRROR = "https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/"
# (size in bytes, SHA-256) of each official .gz file
GZ_SHA256 = {
    "smallnorb-5x46789x9x18x6x2x96x96-training-dat.mat":
        (131896188, "5ffd6272a07d32695ee1082a26a41a93a37aab8c28da047f8c34ed348d214873"),
    "smallnorb-5x46789x9x18x6x2x96x96-training-cat.mat":
        (348, "2784e542c1922060691090952b6cd6278879a216c90f81476f0f00256d42cdaa"),
    "smallnorb-5x46789x9x18x6x2x96x96-training-info.mat":
        (71052, "de7eb932ebe7a4ee16217fead60660d0eb3d23632c2f4d1c51f88c501c17bf32"),
    "smallnorb-5x01235x9x18x6x2x96x96-testing-dat.mat":
        (130799817, "cf7104eed3e51174d2f65b66d1e5878b9da233b886f161b0d88f4510ba2c7474"),
    "smallnorb-5x01235x9x18x6x2x96x96-testing-cat.mat":
        (347, "ecaf6d5bb8c3bc5eab9cf0258f6d2198dd474e016e374836fc097f2e5ff509ff"),
    "smallnorb-5x01235x9x18x6x2x96x96-testing-info.mat":
        (10428, "16adf314226327ee006d1a44db8cfef52773c06c829951d5653a9f6f310248a2"),
}
IMAGE_SHAPE = (2, 96, 96)  # the two stereo views, 96x96 each
STORED_SIZE = 48  # images are kept downsampled to 48x48, as the CapsNet literature trains on them


class NORBError(DatasetError, ValueError):
    """A NORB binary-matrix file's magic number, dimensions or length is wrong."""


def _open(path: Path):
    """(stream, size on disk or None): a gzip stream (None: its decompressed size is unknown) or the raw file."""
    with open(path, "rb") as f:
        compressed = f.read(2) == b"\x1f\x8b"
    return (gzip.open(path, "rb"), None) if compressed else (open(path, "rb"), path.stat().st_size)


def _read_exact(stream, count: int, path: Path, what: str) -> bytes:
    try:
        data = stream.read(count)
    except CORRUPT_STREAM_ERRORS as exc:
        raise NORBError(f"{path}: the gzip stream is truncated or corrupt ({exc})") from exc
    if len(data) != count:
        raise NORBError(f"{path}: truncated in the {what} ({len(data)} of {count} bytes)")
    return data


def _length_error(path, shape, dtype, expected: int, found: int, stream: str = "") -> NORBError:
    if found < expected:
        return NORBError(f"{path}: truncated or damaged: its header {shape} ({dtype}) declares {expected:,} bytes of "
                         f"data, the {stream or 'file'} holds {found:,}")
    return NORBError(f"{path}: longer than its header {shape} ({dtype}) says ({expected:,} bytes of data)")


def _count_bytes(stream, limit: int) -> int:
    """How many bytes ``stream`` yields, reading (and dropping) no more than ``limit``: constant memory."""
    count = 0
    while count < limit:
        chunk = stream.read(min(READ_CHUNK, limit - count))
        if not chunk:
            break
        count += len(chunk)
    return count


def _allocate(shape, dtype, expected: int, available):
    """An uninitialised array for the data, or None where it cannot fit (more than the memory
    available, or than NumPy can index or allocate)."""
    if available is not None and expected > available:
        return None
    try:
        return np.empty(shape, dtype=dtype)
    except (MemoryError, ValueError):  # ValueError: more bytes than an array can index
        return None


def _oversized_error(stream, path, shape, dtype, expected: int, available) -> NORBError:
    """The error for data that cannot be allocated. A gzip stream is first measured (decompressed and
    dropped, never beyond the memory available), so that a header overstating its data is reported
    as a damaged file, not as a lack of memory."""
    if stream is not None:
        limit = expected if available is None else min(expected, available + 1)
        try:
            found = _count_bytes(stream, limit)
        except CORRUPT_STREAM_ERRORS as exc:
            return NORBError(f"{path}: the gzip stream is truncated or corrupt ({exc})")
        if found < limit:  # the stream ended before the declared size (or the memory) was reached
            return _length_error(path, shape, dtype, expected, found, "gzip stream")
    limit = (f"the {available:,} bytes of memory available" if available is not None and expected > available
             else "what this machine can allocate")
    return NORBError(f"{path}: its header declares {shape} ({dtype}), {expected:,} bytes of data, more than {limit}")


def read_norb_matrix(path) -> np.ndarray:
    """Read a NORB binary-matrix file (raw or gzip): returns an array of its element type and shape.

    Raises NORBError naming the file for a wrong magic number, a dimension count outside 1..16,
    a truncated file or one longer than its header says. The sizes the header declares are checked
    against the file's size (a gzip stream: against its decompressed data, read in chunks) before
    the array is allocated.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    stream, size_on_disk = _open(path)
    with stream:
        magic, ndim = np.frombuffer(_read_exact(stream, 8, path, "header"), dtype="<i4").tolist()
        if magic & 0xFFFFFFFF not in NORB_TYPES:
            raise NORBError(f"{path}: not a NORB binary matrix (bad magic number 0x{magic & 0xFFFFFFFF:08X})")
        if not 1 <= ndim <= 16:
            raise NORBError(f"{path}: a NORB header with {ndim} dimensions (expected 1 to 16)")
        dims = np.frombuffer(_read_exact(stream, 4 * max(3, ndim), path, "header"), dtype="<i4")
        shape = tuple(int(d) for d in dims[:ndim])
        if any(d < 0 for d in dims):
            raise NORBError(f"{path}: negative dimension in {tuple(dims.tolist())}")
        dtype = NORB_TYPES[magic & 0xFFFFFFFF]
        expected = math.prod(shape) * dtype.itemsize
        if size_on_disk is not None and size_on_disk - 8 - 4 * max(3, ndim) != expected:
            raise _length_error(path, shape, dtype, expected, size_on_disk - 8 - 4 * max(3, ndim))
        available = meminfo_available_bytes()
        array = _allocate(shape, dtype, expected, available)
        if array is None:
            raise _oversized_error(stream if size_on_disk is None else None, path, shape, dtype, expected, available)
        payload = memoryview(array.reshape(-1).view(np.uint8))
        try:
            got = stream.readinto(payload)
            while got < len(payload):
                more = stream.readinto(payload[got:])
                if not more:
                    break
                got += more
            extra = stream.read(1)
        except CORRUPT_STREAM_ERRORS as exc:
            raise NORBError(f"{path}: the gzip stream is truncated or corrupt ({exc})") from exc
    if got != expected or extra:
        raise _length_error(path, shape, dtype, expected, got + len(extra))
    return array.astype(dtype.newbyteorder("="), copy=False)


def write_norb_matrix(path, array, compress: bool = False) -> None:
    """Write ``array`` (uint8, int16, int32, float32 or float64) as a NORB binary matrix; for tests and tools."""
    array = np.asarray(array)
    codes = {dtype.newbyteorder("="): magic for magic, dtype in NORB_TYPES.items()}
    magic = codes.get(array.dtype.newbyteorder("="))
    if magic is None:
        raise ValueError(f"write_norb_matrix: unsupported dtype {array.dtype}")
    dims = list(array.shape) + [1] * max(0, 3 - array.ndim)
    header = np.asarray([magic, array.ndim] + dims, dtype="<u4").tobytes()
    data = header + array.astype(NORB_TYPES[magic]).tobytes()
    Path(path).write_bytes(gzip.compress(data) if compress else data)


def _required(split: str) -> list[str]:
    return [f"{SPLIT_PREFIX[split]}-{kind}.mat" for kind in ("dat", "cat")]


def find_smallnorb_dir(split: str, data_dir=None):
    """The first searched folder holding ``split``'s dat and cat files (raw or .gz), or None.

    A folder given as ``data_dir`` (or its ``smallnorb`` subfolder) that holds some smallNORB files
    but not these two is an error (DatasetError naming the missing ones), never a reason to fall
    through to another copy.
    """
    user_folders = () if data_dir is None else (Path(data_dir), Path(data_dir) / "smallnorb")
    every_file = [f"{prefix}-{kind}.mat" for prefix in SPLIT_PREFIX.values() for kind in ("dat", "cat", "info")]
    for folder in search_dirs("smallnorb", data_dir):
        found = [find_file(folder, stem) for stem in _required(split)]
        if all(found):
            return folder
        if folder in user_folders and any(find_file(folder, stem) for stem in every_file):
            missing = ", ".join(f"{stem}[.gz]" for stem, path in zip(_required(split), found) if path is None)
            raise DatasetError(f"{folder} holds only part of dataset 'smallnorb': {missing} missing ({split} split)")
    return None


def download_smallnorb(split: str, target: Path) -> Path:
    """Fetch ``split``'s three official .gz files into ``target`` (size and SHA-256 checked, atomic)."""
    for kind in ("dat", "cat", "info"):
        stem = f"{SPLIT_PREFIX[split]}-{kind}.mat"
        if find_file(target, stem):
            continue
        size, digest = GZ_SHA256[stem]

        def checked_size(payload, stem=stem, size=size):
            if len(payload) != size:
                raise OSError(f"{stem}.gz has {len(payload)} bytes, expected {size}")
            return payload

        fetch_verified([MIRROR + stem + ".gz"], target / f"{stem}.gz", digest, digest_of=checked_size, timeout=120)
    return target


def _missing(split: str, data_dir, reason: str) -> str:
    files = ", ".join(f"{SPLIT_PREFIX[split]}-{kind}.mat[.gz]" for kind in ("dat", "cat", "info"))
    where = Path(data_dir) if data_dir is not None else cache_root() / "smallnorb"
    # each line reads on its own and after "; " (the CLI joins the lines into one)
    return (f"dataset 'smallnorb' ({split}) not found ({reason})\n  put {files} into {where} "
            f"(or pass --data-dir); they are at {MIRROR}")


def check_smallnorb_available(split: str = "train", data_dir=None, download_missing: bool | None = None) -> None:
    """DatasetError, as loading would raise it, where no searched folder holds ``split`` of
    smallNORB and it may not be downloaded; nothing is read or downloaded."""
    if find_smallnorb_dir(split, data_dir) is None:
        _check_downloadable(split, data_dir, download_missing)


def _check_downloadable(split: str, data_dir, download_missing) -> None:
    """DatasetError where ``split`` of smallNORB is missing and downloads are off."""
    if not (downloads_allowed() if download_missing is None else download_missing):
        raise DatasetError(_missing(split, data_dir, "downloads are off"))


def load_smallnorb(split: str = "train", data_dir=None, download_missing: bool | None = None):
    """smallNORB images downsampled to 48x48, the two stereo views as channels, and labels.

    Returns:
        (images, labels): uint8 (N, 2, 48, 48) (each 2x2 block of the 96x96 originals averaged and
        rounded) and int64 (N,) in 0..4 (animal, human, airplane, truck, car).
    """
    if split not in SPLIT_PREFIX:
        raise ValueError(f"load_smallnorb: split must be 'train' or 'test', got {split!r}")
    folder = find_smallnorb_dir(split, data_dir)
    if folder is None:
        _check_downloadable(split, data_dir, download_missing)
        try:
            folder = download_smallnorb(split, cache_root() / "smallnorb")
        except DatasetError as exc:
            raise DatasetError(_missing(split, data_dir, f"offline or the download failed: {exc}")) from exc
    dat_path, cat_path = (find_file(folder, stem) for stem in _required(split))
    images = read_norb_matrix(dat_path)
    labels = read_norb_matrix(cat_path)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != IMAGE_SHAPE:
        raise DatasetError(f"{dat_path}: expected uint8 images (N, 2, 96, 96), got {images.dtype} {images.shape}")
    if labels.dtype != np.int32 or labels.ndim != 1 or len(labels) != len(images):
        raise DatasetError(f"{cat_path}: expected {len(images)} int32 labels, got {labels.dtype} {labels.shape}")
    require_examples(len(images), "smallnorb", split, dat_path)
    bad = np.flatnonzero((labels < 0) | (labels >= len(CLASSES)))
    if bad.size:
        raise DatasetError(f"{cat_path}: label {int(labels[bad[0]])} at index {int(bad[0])} is out of range 0..4")
    info_path = find_file(folder, f"{SPLIT_PREFIX[split]}-info.mat")
    if info_path is not None:
        info = read_norb_matrix(info_path)
        if info.ndim != 2 or info.shape != (len(images), 4):
            raise DatasetError(f"{info_path}: expected info of shape ({len(images)}, 4), got {info.shape}")
    chunk = 1024  # keeps the float temporaries of the 2x2 averaging small
    small = np.concatenate([downsample_by_mean(images[k:k + chunk], 96 // STORED_SIZE)
                            for k in range(0, len(images), chunk)])
    return small, labels.astype(np.int64)
