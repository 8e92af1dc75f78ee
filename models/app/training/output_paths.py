"""Checks of the files a command will write (pictures and the JSON beside them), made before any
work so that a bad name ends in one line instead of a matplotlib traceback after minutes of work;
and the default names and labels derived from a checkpoint's run folder.

A picture's suffix chooses its format and is required: a name without one is refused rather than
left to matplotlib, which would write ``NAME.png`` while the command reported ``NAME``.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ...analysis.figure_style import PICTURE_SUFFIXES
from ...errors import UsageError
from .run_folder import RunFolder

SUFFIX_TEXT = ", ".join(PICTURE_SUFFIXES[:-1]) + " or " + PICTURE_SUFFIXES[-1]


def picture_help(default: str | None = None) -> str:
    """The help text of an option that names a picture."""
    text = f"the picture: a {SUFFIX_TEXT} file (the suffix chooses the format; a name without one is refused)"
    return f"{text}; default: {default}" if default else text


def check_picture_path(path, option: str, sidecars=()) -> Path:
    """Raise UsageError unless ``path`` names a picture this package can write: a suffix in
    PICTURE_SUFFIXES and a writable place; ``sidecars`` are the suffixes of files written beside it
    (``.json``, ``.gif``), checked the same way. Creates nothing; returns ``Path(path)``."""
    text = str(path)
    if not text.strip():
        raise UsageError(f"{option}: give a file name ending in {SUFFIX_TEXT}")
    path = Path(path)
    suffix = path.suffix.lower()
    if text.endswith(("/", os.sep)) or _is_dir(path):
        raise UsageError(f"{option} {text} is a folder; name a {SUFFIX_TEXT} file")
    if not suffix:
        raise UsageError(f"{option} {text} has no suffix; name a {SUFFIX_TEXT} file (the suffix chooses the format)")
    if suffix not in PICTURE_SUFFIXES:
        raise UsageError(f"{option} {text}: pictures can be {SUFFIX_TEXT} files, not {path.suffix}")
    check_writable_file(path, option)
    for extra in sidecars:
        check_writable_file(path.with_suffix(extra), option)
    return path


def check_writable_file(path, option: str) -> Path:
    """Raise UsageError unless the file ``path`` can be written (replaced where it exists); the folders
    above it may be missing (they are created on writing) but the nearest existing one must be a
    writable folder. Leaves nothing behind."""
    path = Path(path)
    absolute = path.absolute()
    name_max, path_max = _limits(_nearest_existing(absolute))
    for part in absolute.parts:
        if len(os.fsencode(part)) > name_max:
            raise UsageError(f"{option}: the name {part[:40]}... is longer than the {name_max} bytes this file "
                             "system allows")
    if len(os.fsencode(str(absolute))) >= path_max:
        raise UsageError(f"{option}: the path is longer than the {path_max} bytes this system allows")
    if _exists(absolute):
        if _is_dir(absolute):
            raise UsageError(f"{option}: {path} is a folder, not a file")
        if not os.access(absolute, os.W_OK):
            raise UsageError(f"{option}: {path} exists and is not writable")
        return path
    existing = _nearest_existing(absolute.parent)
    if not _is_dir(existing):
        raise UsageError(f"{option} {path}: {existing} is a file, so no file can be made under it")
    if not can_create_in(existing):
        raise UsageError(f"{option} {path}: the folder {existing} is not writable")
    return path


def can_create_in(folder) -> bool:
    """Whether a file can be made in ``folder``: tried, not inferred from the permission bits (root
    passes every access check, yet cannot create files in /proc or on a read-only mount); the
    trial file is removed at once."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        handle, name = tempfile.mkstemp(dir=folder, prefix=".tinygrad-caps-write-check-")
    except OSError:
        return False
    os.close(handle)
    os.unlink(name)
    return True


def run_name(checkpoint) -> str:
    """The name that stands for a checkpoint in legends: its run folder's name."""
    folder = RunFolder.of_checkpoint(checkpoint)
    return folder.name or str(folder)


def _nearest_existing(path: Path) -> Path:
    while not _exists(path) and path != path.parent:
        path = path.parent
    return path


def _limits(folder: Path) -> tuple:
    try:
        return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError):
        return 255, 4096


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long, a loop of links: treat as absent and let the length check speak
        return False


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False
