"""The IDX file format (MNIST's): reading with full validation, and writing (for tests and tools)."""
from __future__ import annotations

import gzip
import hashlib
import io
import math
import os
from pathlib import Path

import numpy as np

from .errors import CORRUPT_STREAM_ERRORS, DatasetError

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
READ_CHUNK = 1 << 20  # bytes read (or decompressed) at a time


class IDXError(DatasetError, ValueError):
    """An IDX file's header or length is wrong."""


def _parse_header(head: bytes, name: str):
    """(element dtype, shape, header length) from the first bytes of an IDX file; raises IDXError."""
    if len(head) < 4 or head[0] != 0 or head[1] != 0:
        raise IDXError(f"{name}: not an IDX file (bad magic number {head[:4].hex() or 'empty'})")
    type_code, ndim = head[2], head[3]
    if type_code not in _IDX_TYPES:
        raise IDXError(f"{name}: unknown IDX element type 0x{type_code:02x}")
    if ndim == 0 or len(head) < 4 + 4 * ndim:
        raise IDXError(f"{name}: IDX header with {ndim} dimensions is truncated")
    shape = tuple(int(n) for n in np.frombuffer(head, dtype=">u4", count=ndim, offset=4))
    return np.dtype(_IDX_TYPES[type_code]), shape, 4 + 4 * ndim


def _length_error(name, length, shape, dtype, expected):
    return IDXError(f"{name}: {length} bytes, but its header {shape} ({dtype}) needs {expected}: "
                    f"the file is {'truncated' if length < expected else 'longer than its header says'}")


def parse_idx(data: bytes, name: str = "<bytes>") -> np.ndarray:
    """Decode IDX bytes: validates the magic number, the dimensions and the exact length."""
    dtype, shape, offset = _parse_header(data[:4 + 4 * 255], name)
    expected = offset + math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise _length_error(name, len(data), shape, dtype, expected)
    return np.frombuffer(data, dtype=dtype, offset=offset).reshape(shape).astype(dtype.newbyteorder("="))


def _read_exactly(stream, count: int) -> bytearray:
    """Up to ``count`` bytes from ``stream`` (fewer only at its end); memory grows with the bytes
    actually read, never with a size a hostile header merely declares."""
    buffer = bytearray()
    while len(buffer) < count:
        chunk = stream.read(min(READ_CHUNK, count - len(buffer)))
        if not chunk:
            break
        buffer += chunk
    return buffer


def _read_header(stream, name: str):
    """(element dtype, shape, header length) from the start of an IDX stream; raises IDXError."""
    head = bytes(_read_exactly(stream, 4))
    if len(head) == 4 and head[:2] == b"\x00\x00":
        head += bytes(_read_exactly(stream, 4 * head[3]))
    return _parse_header(head, name)


def _read_capped(stream, name: str, size_on_disk=None) -> np.ndarray:
    """Decode an IDX stream, reading no more than its header declares (plus one byte to detect excess)."""
    dtype, shape, offset = _read_header(stream, name)
    expected = offset + math.prod(shape) * dtype.itemsize
    if size_on_disk is not None and size_on_disk != expected:
        raise _length_error(name, size_on_disk, shape, dtype, expected)
    available = meminfo_available_bytes()
    if available is not None and expected > available:
        raise IDXError(f"{name}: its header declares {shape} ({dtype}), {expected:,} bytes, more than the "
                       f"{available:,} bytes of memory available")
    body = _read_exactly(stream, expected - offset)
    if len(body) != expected - offset:
        raise _length_error(name, offset + len(body), shape, dtype, expected)
    if stream.read(1):
        raise IDXError(f"{name}: more than the {expected} bytes its header {shape} ({dtype}) declares: "
                       "the file is longer than its header says")
    return np.frombuffer(body, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def meminfo_available_bytes():
    """MemAvailable plus free swap from /proc/meminfo, in bytes; None where it cannot be read."""
    try:
        fields = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                fields[key] = int(rest.split()[0]) * 1024
        return fields["MemAvailable"] + fields.get("SwapFree", 0)
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _read_file(path, read):
    """``read(stream, size_on_disk)`` on the IDX file at ``path``, raw or gzip-compressed (detected
    from its first bytes; size_on_disk is None then). Unreadable files (permissions, a folder)
    raise DatasetError, a corrupt gzip stream IDXError."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file")
    try:
        with open(path, "rb") as raw:
            if raw.read(2) == b"\x1f\x8b":
                raw.seek(0)
                return _read_gzip(raw, path, read)
            raw.seek(0)
            return read(raw, os.fstat(raw.fileno()).st_size)
    except DatasetError:
        raise
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read it ({exc.strerror or exc})") from exc


def _read_gzip(raw, path: Path, read):
    """``read(stream, None)`` on the gzip stream in the binary file object ``raw``; a corrupt stream
    raises IDXError."""
    try:
        with gzip.GzipFile(fileobj=raw) as stream:
            return read(stream, None)
    except CORRUPT_STREAM_ERRORS as exc:
        raise IDXError(f"{path}: the gzip stream is truncated or corrupt ({exc})") from exc


def read_idx(path) -> np.ndarray:
    """Read an IDX file, raw or gzip-compressed (detected from its first bytes).

    A gzip stream is decompressed in chunks and never beyond the size the IDX header declares, so a
    small file that expands to gigabytes is refused after reading one byte past that size.
    Unreadable files (permissions, a folder) raise DatasetError. A large compressed file read again
    in the same process with the same bytes (a study's runs in one process) is decoded once; each
    call returns an array of its own.
    """
    def decode(stream, size_on_disk):
        return _read_capped(stream, str(path), size_on_disk)

    compressed = _large_gzip_bytes(path)
    if compressed is None:
        return _read_file(path, decode)
    key = (str(Path(path).resolve()), hashlib.sha1(compressed, usedforsecurity=False).hexdigest())
    array = _decoded.pop(key, None)
    if array is None:
        array = _read_gzip(io.BytesIO(compressed), Path(path), decode)
    _decoded[key] = array  # the most recently used last
    while len(_decoded) > CACHED_FILES:
        del _decoded[next(iter(_decoded))]
    return array.copy()


# Decoded gzip-compressed IDX files of at least CACHED_BYTES, keyed by their path and a digest of
# their bytes (a file rewritten within a timestamp tick is not mistaken for the old one): hashing
# Fashion-MNIST's 26 MB training file takes a tenth of what decompressing it does.
CACHED_BYTES = 1 << 20
CACHED_FILES = 4
_decoded: dict = {}


def _large_gzip_bytes(path):
    """The bytes of the file at ``path`` when it is gzip-compressed and at least CACHED_BYTES long,
    else None (and None where it cannot be read: read_idx then says why)."""
    try:
        path = Path(path)
        if not path.is_file() or path.stat().st_size < CACHED_BYTES:
            return None
        with open(path, "rb") as raw:
            head = raw.read(2)
            return head + raw.read() if head == b"\x1f\x8b" else None  # (an uncompressed file is not read twice)
    except OSError:
        return None


def read_idx_header(path) -> tuple:
    """(element dtype, shape) of an IDX file from its header alone (its data is not read)."""
    return _read_file(path, lambda stream, size_on_disk: _read_header(stream, str(path))[:2])


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
