"""Crash consistency of a training run: stop signals, critical sections, and the metrics file.

Signals. The first SIGINT (Ctrl-C) or SIGTERM asks the run to stop at the end of the current batch;
the run then saves ``last.npz`` and exits with 128 + the signal number (130, 143). A second one
interrupts at once, except inside a critical section (an optimizer step with its counters, or a
checkpoint commit), where it is deferred to the section's end, so no checkpoint can ever hold a
step applied to the weights but not counted (or the reverse). A Ctrl-C during start-up that the
launcher's handler recorded (its ``received``) stops the run at its first batch boundary.

Metrics. An epoch's line is appended to ``metrics.jsonl`` (and fsynced) before the checkpoint that
records that epoch is written; the checkpoint is the single source of truth. On resume, every line
beyond the checkpoint's epoch is dropped and the file is rewritten atomically, so a process killed
between the line and the checkpoint cannot leave an epoch twice.

Test hook. ``TINYGRAD_CAPS_TEST_CRASH=point@n[:SIG[,SIG]]`` sends the named signals (default KILL)
to the process itself the n-th time it passes ``crash_point(point)``; the crash-consistency tests
use it to stop a run at exact places. With ``TINYGRAD_CAPS_TEST_CRASH_ONCE=PATH`` as well, only the
first process to get there (the one that creates PATH) is stopped: the study tests kill one run's
process (or Ray worker) among many, and the run started again goes on. ``TINYGRAD_CAPS_TEST_HOLD=point@n:DIR``
holds a process the n-th time it passes ``point``: it creates DIR/held-PID and waits until DIR/release
exists, so that a test can signal runs that are certainly mid-epoch. Unset, ``crash_point`` does nothing.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

from tinygrad_caps.serialization import write_atomically

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
CRASH_ENV = "TINYGRAD_CAPS_TEST_CRASH"
CRASH_ONCE_ENV = "TINYGRAD_CAPS_TEST_CRASH_ONCE"
HOLD_ENV = "TINYGRAD_CAPS_TEST_HOLD"


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal; ``signum`` says which (the exit status is 128 + signum)."""

    def __init__(self, signum=signal.SIGINT):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = int(signum)


class TimeLimitReached(Interrupted):
    """The run reached the time it was given (``Trainer.deadline``, ``study run --max-minutes``):
    it stopped at a batch boundary and saved ``last.npz`` as after Ctrl-C."""

    def __init__(self):
        KeyboardInterrupt.__init__(self, "time limit reached")
        self.signum = int(signal.SIGALRM)


class StopSignals:
    """Installs SIGINT and SIGTERM handlers for the duration of a ``with`` block (main thread only).

    ``requested`` is the first signal received (None before); the training loop polls it at batch
    boundaries. ``critical()`` opens a section in which a second signal is held back.
    """

    def __init__(self):
        self.requested = None
        self._pending = None
        self._depth = 0
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            # the launcher's start-up handler remembers a Ctrl-C whose KeyboardInterrupt some
            # import swallowed (tinygrad_caps_cli.StartUpInterrupt): it becomes this run's stop
            # request, honoured at the first batch boundary (where ranks agree on stops)
            start_up = self._previous[signal.SIGINT]
            if getattr(start_up, "received", None) is not None:
                self.requested, start_up.received = start_up.received, None
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        return False

    def _handle(self, signum, frame):
        if self.requested is None:
            self.requested = signum
        elif self._depth > 0:
            self._pending = signum
        else:
            raise Interrupted(signum)

    def check(self) -> None:
        """Raise Interrupted if a stop was requested (call at batch boundaries)."""
        if self.requested is not None:
            raise Interrupted(self.requested)

    @contextlib.contextmanager
    def critical(self, raise_pending: bool = True):
        """A section that a second signal cannot cut; it is raised (as Interrupted) when the section ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self._pending is not None and raise_pending:
            signum, self._pending = self._pending, None
            raise Interrupted(signum)


def _parse_crash_spec(text):
    point, _, rest = text.partition("@")
    count, _, names = rest.partition(":")
    signals = [getattr(signal, f"SIG{name.strip().upper()}") for name in (names or "KILL").split(",")]
    return point, int(count or 1), signals


_crash_counts = {}


def _first_crash_of_all() -> bool:
    """With $TINYGRAD_CAPS_TEST_CRASH_ONCE=PATH, True only for the one process that creates PATH (so a
    run started again after the crash, or another run of a study, is not stopped too); else True."""
    marker = os.environ.get(CRASH_ONCE_ENV)
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


def _hold_point(point: str) -> None:
    """$TINYGRAD_CAPS_TEST_HOLD=point@n:DIR: the n-th pass creates DIR/held-PID, then waits for DIR/release."""
    spec = os.environ.get(HOLD_ENV)
    if not spec or spec.partition("@")[0] != point:
        return
    count, _, folder = spec.partition("@")[2].partition(":")
    _hold_counts[point] = _hold_counts.get(point, 0) + 1
    if _hold_counts[point] == int(count):
        Path(folder, f"held-{os.getpid()}").touch()
        while not Path(folder, "release").exists():
            time.sleep(0.01)


_hold_counts = {}


def crash_point(point: str) -> None:
    """The test hooks described in the module docstring; do nothing unless $TINYGRAD_CAPS_TEST_CRASH or
    $TINYGRAD_CAPS_TEST_HOLD names ``point``."""
    _hold_point(point)
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    name, count, signals = _parse_crash_spec(spec)
    if name != point:
        return
    _crash_counts[point] = _crash_counts.get(point, 0) + 1
    if _crash_counts[point] == count and _first_crash_of_all():
        for signum in signals:
            os.kill(os.getpid(), signum)


def append_metrics_line(path: Path, line: str) -> None:
    """Append one line to the metrics file and force it to disk before returning."""
    with open(path, "a") as f:
        f.write(line.rstrip("\n") + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_text_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that a reader sees the old or the new content, never a mix."""
    write_atomically(path, lambda f: f.write(text), text=True, usual_permissions=True)


def keep_covered_lines(path: Path, covers) -> int:
    """The one truncation rule of a run's line logs on resume: keep the lines the checkpoint covers,
    drop those beyond it (they are trained and logged again) and a last line cut short by a kill,
    and rewrite the file atomically; returns how many lines were dropped.

    ``covers(number, line)`` (1-based) says True (covered), False (beyond the checkpoint) or None
    (not a complete record: dropped when it is the last line, kept otherwise, since a kill cannot
    cause it and the file's readers report it). A kept line missing its newline gets one.
    """
    path = Path(path)
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines(keepends=True)
    kept = []
    for number, line in enumerate(lines, 1):
        covered = covers(number, line)
        if covered is None and number < len(lines):
            kept.append(line)
        elif covered:
            kept.append(line if line.endswith("\n") else line + "\n")
    if kept == lines:
        return 0
    write_text_atomically(path, "".join(kept))
    return len(lines) - len(kept)


def keep_metrics_through_epoch(path: Path, epochs: int) -> int:
    """Keep the first ``epochs`` lines of the metrics file (those the checkpoint covers); returns how
    many were dropped (``keep_covered_lines``; a missing file is created empty)."""
    path = Path(path)
    if not path.exists():
        write_text_atomically(path, "")
        return 0
    return keep_covered_lines(path, lambda number, line: number <= epochs)


def remove_stale_temporaries(folder: Path) -> list:
    """Delete ``.tmp-*`` files that an interrupted save left in ``folder``; returns their names."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for stale in folder.glob(".tmp-*"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
            removed.append(stale.name)
    return removed
