"""Files replaced atomically: a reader (or a crash) sees the old content or the new, never a mix."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def current_umask() -> int:
    """The process's umask, read without changing it where /proc allows."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path, write, *, text: bool = False, prefix: str = ".tmp-", usual_permissions: bool = False,
                     sync_folder: bool = False) -> None:
    """Replace ``path`` by what ``write(file)`` writes into an open file (text or binary).

    The content goes to a temporary file in the same folder (named ``prefix...`` with ``path``'s
    suffix), is flushed and fsynced, and is renamed over ``path``; the temporary file is removed if
    anything fails. ``usual_permissions``: 0666 less the umask, as ``open`` would give, instead of the
    temporary file's 0600. ``sync_folder``: fsync the folder too, so that the rename survives a crash
    (skipped where the file system cannot).
    """
    path = Path(path)
    folder = path.absolute().parent
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=path.suffix, dir=folder)
    try:
        if usual_permissions:
            os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w" if text else "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync_folder:
        with contextlib.suppress(OSError):  # some file systems cannot fsync a directory
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
