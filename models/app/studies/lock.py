"""One driver per study folder: DIR/study.lock, held while ``study run`` writes and trains there.

The lock file is created with O_CREAT | O_EXCL (so of two drivers exactly one creates it) and holds
{"host", "pid", "started", "token"} of its driver. A second ``study run`` of the folder is refused
in one line naming the first driver. A lock whose driver ran on this host and whose process is
gone (a kill -9, a crash of the machine's job) is taken over; one of another host cannot be
checked and is refused with the file's name, to delete once that driver has ended. The driver
removes its lock when it ends, also on an error or Ctrl-C.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import uuid
from pathlib import Path

from ...errors import UsageError

LOCK_FILE = "study.lock"


@contextlib.contextmanager
def study_lock(folder):
    """Hold ``folder``/study.lock for the block (``folder`` is created); UsageError naming the
    driver that holds it already."""
    path = Path(folder) / LOCK_FILE
    Path(folder).mkdir(parents=True, exist_ok=True)
    text = acquire(path)
    try:
        yield path
    finally:
        release(path, text)


def acquire(path: Path) -> str:
    """Create the lock file ``path`` for this process (taking over a stale one); returns what it holds."""
    text = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                       "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                       "token": uuid.uuid4().hex}) + "\n"
    for _ in range(5):  # a lock that vanishes or is taken over between two looks: look again
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            held = _read(path)
            if held is None:
                continue  # released in between
            holder = _holder(held)
            if holder is not None and _is_stale(holder):
                _take_over(path, held)
                continue
            raise UsageError(_refusal(path, holder))
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
        except BaseException:  # a full disk: leave no empty lock behind
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        return text
    raise UsageError(_refusal(path, _holder(_read(path) or "")))


def release(path: Path, text: str) -> None:
    """Remove the lock file ``path`` if it still holds ``text`` (this driver's)."""
    if _read(path) == text:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def _read(path: Path):
    """The lock file's text, or None where there is none."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return ""


def _holder(text: str):
    """{"host", "pid", "started"} of a lock file's text, or None where it holds no such record
    (a lock being written, or damaged)."""
    try:
        holder = json.loads(text)
    except ValueError:
        return None
    if not isinstance(holder, dict) or not isinstance(holder.get("host"), str):
        return None
    pid = holder.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    return holder


def _is_stale(holder: dict) -> bool:
    """A lock of this host whose process is gone."""
    return holder["host"] == socket.gethostname() and not process_alive(holder["pid"])


def _take_over(path: Path, stale: str) -> None:
    """Remove the stale lock ``path`` (holding ``stale``) unless another driver replaced it meanwhile:
    it is moved aside first (atomic), and put back where it is not the stale one."""
    aside = path.with_name(f"{path.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    try:
        if _read(aside) != stale:  # a driver's fresh lock: back in place, unless a newer one exists
            with contextlib.suppress(FileExistsError, OSError):
                os.link(aside, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            aside.unlink()


def _refusal(path: Path, holder) -> str:
    """The one-line refusal naming the driver that holds ``path``."""
    folder = path.parent
    if holder is None:
        return (f"{folder} is being run by another study run ({path} exists but names no driver); if none runs, "
                f"delete {path} and try again")
    who = f"pid {holder['pid']} on {holder['host']}, started {holder.get('started', '?')}"
    if holder["host"] != socket.gethostname():
        return (f"{folder} is being run by another study run ({who}); wait for it to end, or, if it has ended, "
                f"delete {path}")
    return f"{folder} is being run by another study run ({who}); wait for it to end, or stop it"
