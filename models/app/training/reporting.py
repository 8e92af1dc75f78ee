"""How the CLI tells user errors from bugs, and how it reports each.

User errors (a bad option, missing or corrupt data or checkpoint, no GPU, an unwritable ``--out``,
a full disk, a model too large for the machine, an MPI or NCCL setup this machine cannot form) are printed as one line and end with exit status
2. Every other exception is a bug: its traceback is printed, then a line asking for a report, and
the exit status is 1. ``--debug`` prints the traceback of user errors too.
"""
from __future__ import annotations

import errno
import sys
import traceback

from tinygrad_caps.data import DatasetError
from tinygrad_caps.errors import CheckpointError, DistributedSetupError

from ...errors import UsageError

USER_ERROR_TYPES = (UsageError, DatasetError, CheckpointError, DistributedSetupError)

# OSErrors that describe the user's files or machine, not our code.
ENVIRONMENT_ERRNOS = frozenset(
    getattr(errno, name) for name in ("EACCES", "EPERM", "ENOENT", "ENOTDIR", "EISDIR", "EEXIST", "ENOTEMPTY",
                                      "ENAMETOOLONG", "ELOOP", "EROFS", "ENOSPC", "EDQUOT", "EFBIG", "EIO",
                                      "EMFILE", "ENFILE", "EXDEV", "EBUSY", "ETXTBSY", "ENXIO", "ENODEV")
    if hasattr(errno, name))

EXIT_USER_ERROR = 2
EXIT_BUG = 1


def is_user_error(exc: BaseException) -> bool:
    """True for the exceptions that report a user's mistake or a limit of the machine."""
    if isinstance(exc, USER_ERROR_TYPES) or isinstance(exc, MemoryError):
        return True
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)):
        return True
    return isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (multi-line hints joined with "; ")."""
    if isinstance(exc, MemoryError):
        # a bare MemoryError() (Python's, Pillow's) has no message: its name at least says what happened
        text = f"out of memory: {str(exc) or 'MemoryError (an allocation failed)'}; use a smaller model or --batch-size"
    elif isinstance(exc, OSError) and not isinstance(exc, USER_ERROR_TYPES) and exc.strerror:
        names = [str(name) for name in (exc.filename, exc.filename2) if name is not None]
        text = f"{exc.strerror}: {' -> '.join(names)}" if names else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def report(exc: BaseException, command: str, debug: bool, stream=None) -> int:
    """Print ``exc`` as the CLI does and return the exit status (2 for user errors, 1 for bugs)."""
    stream = stream or sys.stderr
    user = is_user_error(exc)
    if debug or not user:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=stream)
    if user:
        print(f"tinygrad-caps {command}: error: {one_line(exc)}", file=stream)
        return EXIT_USER_ERROR
    print(f"tinygrad-caps {command}: internal error ({type(exc).__name__}): this is a bug in tinygrad-caps; "
          "please report it with the traceback above and the command line", file=stream)
    return EXIT_BUG


def plural(count, word: str) -> str:
    """"1 epoch", "3 epochs", "0.5 minutes": ``count`` and ``word``, plural unless ``count`` is 1."""
    shown = f"{count:g}" if isinstance(count, float) else str(count)
    return f"{shown} {word}{'' if count == 1 else 's'}"
