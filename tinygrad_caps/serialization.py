"""``save`` and ``load``: nested dicts of arrays and plain values in one ``.npz``, no pickled code.

The file holds each array as its own ``.npy`` member, plus one member ``__tinygrad_caps__.npy``:
UTF-8 JSON that records the nesting (dicts, lists, tuples, numbers, strings, None) and where each
array goes. Writes are atomic: a temporary file in the same folder, fsync, then rename.
"""
from __future__ import annotations

import errno
import json
import math
import os
import zipfile

import numpy as np

from . import backend
from ._atomic_file import write_atomically
from .errors import NPY_HEADER_ERRORS, CheckpointError
from .tensor import Tensor

FORMAT = "tinygrad-caps-checkpoint"
VERSION = 1
META_KEY = "__tinygrad_caps__"


def _encode(value, arrays):
    if isinstance(value, Tensor):
        value = value.data
    if isinstance(value, np.ndarray) or backend.is_cupy_array(value):
        key = f"a{len(arrays)}"
        arrays[key] = backend.to_numpy(value)
        return {"array": key}
    if isinstance(value, dict):
        return {"dict": [[_encode_key(k), _encode(v, arrays)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"list" if isinstance(value, list) else "tuple": [_encode(v, arrays) for v in value]}
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"save: cannot store a value of type {type(value).__name__} (only arrays, Tensors, numbers, "
                    "strings, None, and dicts/lists/tuples of them)")


def _encode_key(key):
    if isinstance(key, (str, int)) and not isinstance(key, bool):
        return key
    raise TypeError(f"save: dict keys must be str or int, got {type(key).__name__}")


def _decode(node, arrays, to_device):
    if "array" in node:
        return to_device(arrays[node["array"]])
    if "dict" in node:
        return {k: _decode(v, arrays, to_device) for k, v in node["dict"]}
    if "list" in node:
        return [_decode(v, arrays, to_device) for v in node["list"]]
    if "tuple" in node:
        return tuple(_decode(v, arrays, to_device) for v in node["tuple"])
    return node["value"]


def save(state, path) -> None:
    """Write ``state`` (nested dicts/lists of arrays, Tensors and plain values) to ``path`` atomically."""
    arrays = {}
    tree = _encode(state, arrays)
    meta = json.dumps({"format": FORMAT, "version": VERSION, "tree": tree}).encode("utf-8")
    arrays[META_KEY] = np.frombuffer(meta, dtype=np.uint8)
    write_atomically(path, lambda f: np.savez(f, **arrays), usual_permissions=True, sync_folder=True)


def _check_members(path, archive: zipfile.ZipFile) -> None:
    """Refuse members whose .npy header declares more bytes than the member holds (before NumPy allocates them)."""
    for info in archive.infolist():
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise CheckpointError(f"load: {path}: member {info.filename} is compressed; tinygrad-caps never writes that")
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version not in ((1, 0), (2, 0)):
                raise CheckpointError(f"load: {path}: member {info.filename} has .npy version {version}")
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            try:
                shape, _, dtype = read_header(member)
            except NPY_HEADER_ERRORS as exc:
                raise CheckpointError(f"load: {path}: member {info.filename} has a damaged .npy header ({exc!r})") from exc
            if dtype.hasobject:
                raise CheckpointError(f"load: {path}: member {info.filename} holds Python objects; refused")
            declared = math.prod(shape) * dtype.itemsize
            if declared != info.file_size - member.tell():
                raise CheckpointError(f"load: {path}: member {info.filename} declares {shape} {dtype} "
                                      f"({declared:,} bytes) but holds {info.file_size - member.tell():,}")


def load(path, device=None):
    """Read a file written by ``save``; arrays come back as NumPy arrays, or on ``device`` if given.

    Raises FileNotFoundError for a missing file and CheckpointError for a truncated, corrupt or
    foreign one.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "load: no checkpoint at this path", path)
    target = None if device is None else backend.normalize_device(device)
    try:
        with zipfile.ZipFile(path) as archive:
            _check_members(path, archive)
        with np.load(path, allow_pickle=False) as npz:
            if META_KEY not in npz.files:
                raise CheckpointError(f"load: {path} is an .npz file but not a tinygrad-caps checkpoint")
            meta = json.loads(npz[META_KEY].tobytes().decode("utf-8"))
            if meta.get("format") != FORMAT:
                raise CheckpointError(f"load: {path} is not a tinygrad-caps checkpoint")
            if meta.get("version", 0) > VERSION:
                raise CheckpointError(f"load: {path} has format version {meta['version']}; this version reads {VERSION}")
            arrays = {k: npz[k] for k in npz.files if k != META_KEY}
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, UnicodeDecodeError, AttributeError, RecursionError,
            *NPY_HEADER_ERRORS) as exc:
        raise CheckpointError(f"load: {path} is truncated, corrupt or not a tinygrad-caps checkpoint ({exc})") from exc
    to_device = (lambda a: a) if target is None else (lambda a: backend.to_device(a, target))
    try:
        return _decode(meta["tree"], arrays, to_device)
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise CheckpointError(f"load: {path} has a damaged structure record ({exc})") from exc
