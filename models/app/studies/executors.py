"""The executor of a ``study run`` call, chosen by its Placement: an ``InProcessExecutor`` (the runs
one at a time in the driver's own process, the default), a ``LocalExecutor`` (worker processes) or
a ``RayExecutor`` (Ray tasks). Every executor trains a run with ``run_task.train_study_run``, and
``driver.drive_runs`` drives each of them through the ``Executor`` protocol."""
from __future__ import annotations

import contextlib
from typing import Protocol

from .folder import StudyFolder


class Executor(Protocol):
    """What ``driver.drive_runs`` asks of an executor."""

    start_verb: str            # what a run's start line says ("started", "submitted to Ray")
    retries_runs: bool         # whether the driver starts a run whose process was killed again
    running_once_started: bool  # whether a run runs from its start line (else from its run lock)
    shares_signals: bool       # whether a run trains in the driver's process (its Ctrl-C stops the study)

    def prepare(self) -> None:
        """Check, before the plan is written, that the runs can train where they will (UsageError)."""

    def has_room(self) -> bool:
        """Whether another run may start now."""

    def running(self) -> list:
        """The PlannedRuns handed over whose results ``wait`` has not returned yet."""

    def start(self, run, deadline=None, must_train: bool = False) -> None:
        """Hand over ``run`` (``deadline``: the study's time limit; ``must_train``: train a batch even after it)."""

    def wait(self, timeout: float) -> list:
        """The RunResults of the runs that ended within ``timeout`` seconds."""

    def kill_all(self) -> None:
        """Stop every run at once (they continue from their last checkpoint on resume)."""

    def close(self) -> None:
        """Release what the executor holds (its processes, a local Ray)."""

    def progress(self, runs, folder, epochs: int, show: bool):
        """The study's lines for the driver (``StudyProgress``'s methods run_handed_over ... close)."""


@contextlib.contextmanager
def executor_for(placement, folder, *, show_progress: bool = False):
    """``with executor_for(placement, folder) as executor``: the executor of ``placement`` for the
    study ``folder`` (a StudyFolder or its path), released when the block ends (its processes
    killed where still running, a local Ray stopped). ``show_progress``: the progress bars of the
    runs that train in this process. A Ray cluster that cannot be reached is a UsageError here,
    before the study's folder is created."""
    folder = StudyFolder.of(folder)
    if placement.in_process:
        from .in_process_executor import InProcessExecutor

        executor = InProcessExecutor(folder, placement, show_progress=show_progress)
    elif placement.executor == "ray":
        from .ray_executor import RayExecutor

        executor = RayExecutor(folder, placement)
    else:
        from .local_executor import LocalExecutor

        executor = LocalExecutor(folder, placement)
    try:
        yield executor
    finally:
        executor.close()
