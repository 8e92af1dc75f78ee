"""Progress bars (tqdm, on stderr) for the commands that run longer than a few seconds: shown only
on a terminal and without ``--no-progress``, so logs and pipes get no bar."""
from __future__ import annotations

import contextlib
import sys


def stderr_is_terminal() -> bool:
    """True when stderr is an interactive terminal (where a bar redraws in place)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def bars_wanted(no_progress: bool) -> bool:
    """Whether a command shows bars: not with ``--no-progress``, and only on a terminal."""
    return not no_progress and stderr_is_terminal()


def progress_bar(total, description, enabled, unit="img"):
    """A tqdm bar of ``total`` ``unit``s (cleared when done), disabled unless ``enabled``; None
    without tqdm. Callers ``update`` it and ``close`` it."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=description, unit=unit, disable=not enabled, dynamic_ncols=True, leave=False)


@contextlib.contextmanager
def progress_shown(total, description, enabled, unit="img"):
    """``with progress_shown(...) as bar``: a ``progress_bar`` (or None), closed when the block ends."""
    bar = progress_bar(total, description, enabled, unit=unit)
    try:
        yield bar
    finally:
        if bar is not None:
            bar.close()
