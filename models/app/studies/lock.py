"""Who holds a study folder or a run folder: DIR/study.lock (one driver per study) and RUN/run.lock
(one process per run, whichever executor started it).

A lock file is created with O_CREAT | O_EXCL (so of two processes exactly one creates it) and holds
{"host", "pid", "started", "token"} of its holder. While it is held, a heartbeat thread touches it
every HEARTBEAT_SECONDS. A lock is stale, and taken over, when its holder ran on this host and its
process is gone (a kill -9, a crash), or when it comes from another host and has not been touched
for STALE_AFTER_SECONDS (its node died: a study continued on another node, a Ray task retried
elsewhere). A lock that is not stale is refused in one line naming its holder. The holder removes
its lock when it ends, also on an error or Ctrl-C.

Clocks: the age of another host's lock is its file's modification time against this host's clock,
so the hosts of one study should keep their clocks within a minute of each other (NTP does).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from ...errors import UsageError
from ..training.run_folder import RunFolder
from .folder import StudyFolder

HEARTBEAT_SECONDS = 15.0
STALE_AFTER_SECONDS = 120.0  # eight missed heartbeats: the holder's host is gone


class LockHeld(UsageError):
    """A lock file is held by a process that is still running (or whose host cannot be checked yet)."""

    def __init__(self, message: str, holder):
        super().__init__(message)
        self.holder = holder


@contextlib.contextmanager
def study_lock(folder):
    """Hold DIR/study.lock of ``folder`` (a StudyFolder, or its path; created) for the block;
    LockHeld (a UsageError) naming the driver that holds it already."""
    folder = StudyFolder.of(folder)
    folder.path.mkdir(parents=True, exist_ok=True)
    with held_lock(folder.lock, "is being run by another study run") as path:
        yield path


@contextlib.contextmanager
def run_lock(run, wait_seconds: float = 0.0):
    """Hold RUN/run.lock of ``run`` (a RunFolder, or its path; created) while the run trains. A lock
    held by a live process is waited for up to ``wait_seconds`` (a retried task whose dead
    predecessor ran on a lost node waits for its lock to go stale), then refused with LockHeld
    naming the holder."""
    run = run if isinstance(run, RunFolder) else RunFolder(run)
    run.path.mkdir(parents=True, exist_ok=True)
    path = run.lock
    held_by = "is being trained by another process"
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            text = acquire(path, held_by)
            break
        except LockHeld:
            if time.monotonic() >= deadline:
                raise
            time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))
    with _holding(path, text):
        yield path


@contextlib.contextmanager
def held_lock(path: Path, held_by: str):
    """Hold the lock file ``path`` for the block, touching it every HEARTBEAT_SECONDS; ``held_by``
    completes the refusal "<folder> <held_by> (pid P on H, started T)"."""
    with _holding(path, acquire(path, held_by)):
        yield path


@contextlib.contextmanager
def _holding(path: Path, text: str):
    """For the block, touch the lock file ``path`` (which holds ``text``, this process's) every
    HEARTBEAT_SECONDS; remove it when the block ends."""
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(path, text, stop), daemon=True, name=f"heartbeat {path.name}")
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        release(path, text)


def acquire(path: Path, held_by: str = "is being run by another study run") -> str:
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
            if holder is not None and _is_stale(holder, path):
                _take_over(path, held)
                continue
            raise LockHeld(_refusal(path, holder, held_by), holder)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
        except BaseException:  # a full disk: leave no empty lock behind
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        return text
    held = _read(path) or ""
    raise LockHeld(_refusal(path, _holder(held), held_by), _holder(held))


def release(path: Path, text: str) -> None:
    """Remove the lock file ``path`` if it still holds ``text`` (this holder's)."""
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


def _heartbeat(path: Path, text: str, stop: threading.Event) -> None:
    """Touch ``path`` every HEARTBEAT_SECONDS while it holds ``text`` and ``stop`` is not set."""
    while not stop.wait(HEARTBEAT_SECONDS):
        if _read(path) != text:
            return
        with contextlib.suppress(OSError):
            os.utime(path)


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


def _is_stale(holder: dict, path: Path) -> bool:
    """A lock of this host whose process is gone, or one of another host not touched for STALE_AFTER_SECONDS."""
    if holder["host"] == socket.gethostname():
        return not process_alive(holder["pid"])
    try:
        return time.time() - path.stat().st_mtime > STALE_AFTER_SECONDS
    except FileNotFoundError:
        return False


def _take_over(path: Path, stale: str) -> None:
    """Remove the stale lock ``path`` (holding ``stale``) unless another process replaced it meanwhile:
    it is moved aside first (atomic), and put back where it is not the stale one."""
    aside = path.with_name(f"{path.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    try:
        if _read(aside) != stale:  # a fresh lock: back in place, unless a newer one exists
            with contextlib.suppress(FileExistsError, OSError):
                os.link(aside, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            aside.unlink()


def _refusal(path: Path, holder, held_by: str) -> str:
    """The one-line refusal naming the process that holds ``path``."""
    folder = path.parent
    if holder is None:
        return f"{folder} {held_by} ({path} exists but names no holder); if none runs, delete {path} and try again"
    who = f"pid {holder['pid']} on {holder['host']}, started {holder.get('started', '?')}"
    if holder["host"] != socket.gethostname():
        return (f"{folder} {held_by} ({who}); wait for it to end (a lock untouched for {STALE_AFTER_SECONDS:.0f} s "
                f"is taken over), or, if it has ended, delete {path}")
    return f"{folder} {held_by} ({who}); wait for it to end, or stop it"
