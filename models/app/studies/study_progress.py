"""The terminal of a study whose runs train elsewhere (worker processes, Ray tasks): one line per run
that starts, finishes or fails, and one study-level progress line: runs finished, running and left,
the epoch of each running run, and an estimate of the time left. A run counts as running from its
"started" line: a worker process's at once (``run_started``), a Ray task's once its RUN/run.lock is
held (``note_started`` prints the line then: a task waiting for resources is not running yet).

On a terminal the progress line is redrawn in place (on stderr, under the event lines); elsewhere
(a log, a pipe) it is printed as a line of its own whenever it changes, at most once every
``LOG_EVERY_SECONDS``. A run's epoch is read from its metrics.jsonl, the study's own record, so the
same line works whichever node trains the run.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..training.run_folder import RunFolder

LOG_EVERY_SECONDS = 30.0


def epochs_done(run_dir: Path) -> int:
    """The epochs a run has logged (the lines of its metrics.jsonl; 0 where it has none)."""
    try:
        with open(RunFolder(run_dir).metrics, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def _duration(seconds: float) -> str:
    """"40 s", "12 min", "3.5 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class StudyProgress:
    """The study's terminal lines (see the module docstring). ``runs``: [(label, run_dir)] of every
    run of the plan; ``epochs``: the epochs of each run. ``start_verb`` and ``running_once_started``:
    the executor's (what a run's start line says; whether a run runs from it, or from its run lock)."""

    def __init__(self, runs, epochs: int, terminal: bool, stream=None, clock=time.monotonic, *,
                 start_verb: str = "started", running_once_started: bool = True):
        self.runs, self.epochs, self.terminal = list(runs), int(epochs), terminal
        self.start_verb, self.running_once_started = start_verb, running_once_started
        self.stream = stream or (sys.stderr if terminal else sys.stdout)
        self.clock, self.started = clock, clock()
        self.running, self.finished, self.failed = set(), set(), set()
        self.training = set()  # the running runs whose "started" line has been printed
        self.epochs_at_start = sum(min(epochs_done(d), self.epochs) for _, d in self.runs)
        self._last_line, self._last_printed = None, None

    @classmethod
    def of_runs(cls, runs, folder, epochs: int, terminal: bool, **options) -> "StudyProgress":
        """The lines of the plan's ``runs`` (PlannedRuns) of the study ``folder`` (a StudyFolder)."""
        return cls([(run.label, folder.run(run.config_id, run.seed).path) for run in runs], epochs, terminal,
                   **options)

    # --- what the driver says happened (``driver.drive_runs``) ---

    def run_was_finished(self, run) -> None:
        """``run`` had finished before this call (it counts as finished; nothing is printed)."""
        self.finished.add(run.label)

    def run_handed_over(self, run, run_dir, retry: str = "") -> None:
        """``run`` was handed to the executor: "[label] started: RUN" (``retry``: " (retry 1 of 3)")."""
        text = f"[{run.label}] {self.start_verb}{retry}: {run_dir}"
        if self.running_once_started:
            self.run_started(run.label, text)
        else:  # (a Ray task: running once it holds its run lock, said by note_started)
            self.running.add(run.label)
            self.event(text)

    def run_ended(self, run) -> None:
        """``run``'s process or task has ended (its outcome follows)."""
        self.running.discard(run.label)
        self.training.discard(run.label)

    def run_finished(self, run) -> None:
        """``run`` has trained every epoch: "[label] finished"."""
        self.finished.add(run.label)
        self.event(f"[{run.label}] finished")

    def run_retried(self, run, reason: str) -> None:
        """``run``'s process was killed (``reason``) and the run starts again."""
        self.event(f"[{run.label}] {reason}; starting it again from its last checkpoint")

    def run_failed(self, run, reason: str) -> None:
        """``run`` failed: "[label] failed: REASON"."""
        self.failed.add(run.label)
        self.event(f"[{run.label}] failed: {reason}")

    def stopping(self, running: int) -> None:
        """Ctrl-C: the ``running`` runs save at their next batch boundary."""
        self.event(f"stopping: every running run saves at its next batch boundary ({running} running)")

    def poll(self) -> None:
        """Note the runs that started meanwhile and redraw the progress line."""
        self.note_started()
        self.refresh()

    # --- the lines ---

    def event(self, text: str) -> None:
        """Print one event line (a run that starts, finishes, fails or is retried) above the progress line."""
        if self.terminal:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self._last_line = None  # draw the progress line again under it
        self.refresh(force=True)

    def run_started(self, label: str, text: str) -> None:
        """Print ``text``, the "started" line of the run ``label``, which counts as running from now on."""
        self.running.add(label)
        self.training.add(label)
        self.event(text)

    def note_started(self) -> None:
        """Print "[label] started" for every run handed over (``running``) whose RUN/run.lock has
        appeared since (a Ray task that got its resources)."""
        for label, run_dir in self.runs:
            if label in self.running and label not in self.training and RunFolder(run_dir).lock.exists():
                self.run_started(label, f"[{label}] started")

    def line(self) -> str:
        """The progress line: "runs: F finished, R running (label epoch e/E, ...), L left; about T left"."""
        done = {label: min(epochs_done(d), self.epochs) for label, d in self.runs}
        training = [label for label, d in self.runs if label in self.running and
                    (label in self.training or RunFolder(d).lock.exists())]
        running = [f"{label} epoch {min(done[label] + 1, self.epochs)}/{self.epochs}" for label in training]
        left = len(self.runs) - len(self.finished) - len(training) - len(self.failed)
        parts = [f"{len(self.finished)} finished", f"{len(training)} running" +
                 (f" ({', '.join(running)})" if running else "")]
        if self.failed:
            parts.append(f"{len(self.failed)} failed")
        text = f"study: {', '.join(parts)}, {max(left, 0)} left"
        trained = sum(done.values()) - self.epochs_at_start
        remaining = sum(self.epochs - done[label] for label, _ in self.runs
                        if label not in self.finished and label not in self.failed)
        elapsed = self.clock() - self.started
        if trained > 0 and remaining > 0:
            text += f"; about {_duration(remaining * elapsed / trained)} left"
        return text

    def refresh(self, force: bool = False) -> None:
        """Draw the progress line where it changed (on a terminal), or print it (elsewhere) where it
        changed and LOG_EVERY_SECONDS have passed since the last one (``force``: whenever it changed)."""
        text = self.line()
        if text == self._last_line:
            return
        now = self.clock()
        if self.terminal:
            self.stream.write("\r\033[K" + text)
        elif force or self._last_printed is None or now - self._last_printed >= LOG_EVERY_SECONDS:
            self.stream.write(text + "\n")
            self._last_printed = now
        else:
            return
        self.stream.flush()
        self._last_line = text

    def close(self) -> None:
        """End the progress line (on a terminal, leave the cursor on a fresh line)."""
        if self.terminal and self._last_line is not None:
            self.stream.write("\n")
            self.stream.flush()
