"""Where datasets live on disk, and verified downloads into that place.

Folders searched for a dataset ``name``, in order: ``data_dir`` (the CLI's ``--data-dir``) and
``data_dir/<name>``; ``$TINYGRAD_CAPS_DATA/<name>``, else ``~/.cache/tinygrad-caps/<name>``; then the
dataset's system folders. ``TINYGRAD_CAPS_OFFLINE=1`` turns downloads off.
"""
from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

from .._atomic_file import write_atomically as write_file_atomically
from .errors import CORRUPT_STREAM_ERRORS, DatasetError


def cache_root() -> Path:
    """``$TINYGRAD_CAPS_DATA`` or ``~/.cache/tinygrad-caps``."""
    return Path(os.environ.get("TINYGRAD_CAPS_DATA") or Path.home() / ".cache" / "tinygrad-caps")


def downloads_allowed() -> bool:
    """False when ``$TINYGRAD_CAPS_OFFLINE`` is 1 (tests and offline machines set it)."""
    return os.environ.get("TINYGRAD_CAPS_OFFLINE", "0") != "1"


def search_dirs(name: str, data_dir=None, system_dirs=()) -> list[Path]:
    """The folders searched for ``name``'s files, in order (see the module docstring)."""
    dirs = []
    if data_dir is not None:
        dirs += [Path(data_dir), Path(data_dir) / name]
    dirs.append(cache_root() / name)
    dirs += [Path(d) for d in system_dirs]
    return dirs


def find_file(folder: Path, stem: str):
    """``folder/stem`` or ``folder/stem.gz``, whichever is a file (that order), else None."""
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def write_atomically(target: Path, payload: bytes) -> None:
    """Write ``payload`` to ``target`` (folders made as needed) through a synced temporary file, then rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomically(target, lambda f: f.write(payload), prefix=".download-")


def fetch_verified(urls, target: Path, sha256: str, digest_of=lambda payload: payload, timeout: float = 60) -> Path:
    """Download the first of ``urls`` whose payload has the expected SHA-256, into ``target`` (atomically).

    ``digest_of`` maps the payload to the bytes whose digest is checked (MNIST's digests are of the
    decompressed files). Raises DatasetError listing every mirror's failure.
    """
    errors = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                payload = response.read()
        except OSError as exc:
            errors.append(f"{url}: {exc}")
            continue
        try:
            digest = hashlib.sha256(digest_of(payload)).hexdigest()
        except CORRUPT_STREAM_ERRORS as exc:
            errors.append(f"{url}: corrupt payload ({exc})")
            continue
        if digest != sha256:
            errors.append(f"{url}: SHA-256 mismatch ({digest})")
            continue
        write_atomically(target, payload)
        return target
    raise DatasetError(f"could not download {target.name}: " + "; ".join(errors))
