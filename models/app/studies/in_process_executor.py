"""The in-process executor: the runs of a study one at a time in the driver's own process (``study
run``'s default, ``--jobs 1``), through the same loop as the local and Ray executors
(``driver.drive_runs``).

Each run's lines go to stdout, prefixed with the run ("[routing1 seed 0] epoch 1: ..."), and to its
RUN/train.log as they are. The study's own lines are those it has always printed: "[label]
training RUN" (or "continuing RUN" for a run with a checkpoint) before a run, and "[label] failed:
REASON" after a failed one; no progress line (the Trainer draws its bars). A run shares the
driver's signals: its Ctrl-C (or SIGTERM) saves the run, and the study stops after it.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from ..training.run_folder import RunFolder
from .folder import StudyFolder
from .run_task import run_status, train_study_run


class InProcessExecutor:
    """Runs one at a time in the driver's process, the --jobs 1 default (see the module docstring)."""

    retries_runs = False  # (a run killed by a signal takes the driver with it)
    start_verb = "training"
    running_once_started = True
    shares_signals = True  # a Ctrl-C stops the run, then the study

    def __init__(self, folder, placement=None, *, show_progress: bool = False, log=print):
        self.folder, self.placement = StudyFolder.of(folder), placement
        self.show_progress, self.log = show_progress, log
        self.queued = []  # [(PlannedRun, deadline)]: the run handed over, trained by the next ``wait``

    def prepare(self) -> None:
        """Nothing to check: the runs train here."""

    def has_room(self) -> bool:
        """Whether no run waits to be trained (one at a time)."""
        return not self.queued

    def running(self) -> list:
        """The run handed over and not yet trained (at most one)."""
        return [run for run, _ in self.queued]

    def start(self, run, deadline=None, must_train=False) -> None:
        """Queue ``run``; the next ``wait`` trains it (the driver has checked ``deadline`` just now,
        and a run started trains at least one batch)."""
        self.queued.append((run, deadline))

    def wait(self, timeout: float) -> list:
        """Train the queued run to its end here (``timeout`` does not apply); its RunResult."""
        if not self.queued:
            return []
        run, deadline = self.queued.pop(0)
        folder = self.folder.run(run.config_id, run.seed)
        with run_log(folder, lambda text: self.log(f"[{run.label}] {text}")) as both:
            result = train_study_run(self.folder, run.config_id, run.seed, deadline=deadline, log=both,
                                     show_progress=self.show_progress)
        return [result.with_run(run)]

    def kill_all(self) -> None:
        """Forget the queued run (a run training here is stopped by its own signals)."""
        self.queued.clear()

    def close(self) -> None:
        """Nothing runs elsewhere."""
        self.kill_all()

    def progress(self, runs, folder, epochs: int, show: bool) -> "SequentialLines":
        """The lines of a study trained here (``SequentialLines``)."""
        return SequentialLines(epochs, self.log)


class SequentialLines:
    """The study's lines where its runs train one at a time here (the module docstring)."""

    def __init__(self, epochs: int, log=print):
        self.epochs, self.log = int(epochs), log

    def run_was_finished(self, run) -> None:
        """Nothing is said of a run finished before."""

    def run_handed_over(self, run, run_dir, retry: str = "") -> None:
        """"[label] training RUN", or "continuing RUN" where the run has a checkpoint to continue from."""
        verb = "continuing" if run_status(run_dir, self.epochs) == "started" else "training"
        self.log(f"[{run.label}] {verb}{retry} {run_dir}")

    def run_ended(self, run) -> None:
        """Nothing to note: the run's own lines have said how it went."""

    def run_finished(self, run) -> None:
        """Nothing to add: the run's last epoch line has been printed."""

    def run_retried(self, run, reason: str) -> None:
        """(Not met: a run here is never started again.)"""
        self.log(f"[{run.label}] {reason}; starting it again from its last checkpoint")

    def run_failed(self, run, reason: str) -> None:
        """"[label] failed: REASON"."""
        self.log(f"[{run.label}] failed: {reason}")

    def stopping(self, running: int) -> None:
        """Nothing to say: between two runs, none is running (the study stops at once)."""

    def poll(self) -> None:
        """No progress line."""

    def close(self) -> None:
        """No progress line to end."""


@contextlib.contextmanager
def run_log(run, terminal):
    """A log that writes each line to ``terminal`` and appends it to RUN/train.log (the folder is
    created); ``run``: a RunFolder or its path."""
    path = (run if isinstance(run, RunFolder) else RunFolder(Path(run))).train_log
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as file:
        def both(text: str) -> None:
            terminal(text)
            file.write(f"{text}\n")
            file.flush()

        yield both
