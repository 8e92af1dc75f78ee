"""Why a run stops at a batch boundary, saving ``last.npz`` first: a stop signal (SIGINT, SIGTERM;
``run_state.StopSignals``), a closed stdout, the time limit (``deadline``, only once the run has
moved on from where it started, so every call of a time-limited study makes progress) and a stop
file (a study's DIR/study.stop, which its driver writes on Ctrl-C and every node sees)."""
from __future__ import annotations

import shlex
import signal
import time
from pathlib import Path

from .run_state import Interrupted, StopSignals, TimeLimitReached


class StopConditions:
    """The stop conditions of one run: ``with`` it, its signal handlers are installed; ``critical()``
    holds a second signal back; ``check_signals(run)`` and ``check_deadline(deadline)`` raise
    Interrupted and TimeLimitReached."""

    def __init__(self, deadline=None, stop_file=None):
        self.signals, self.stdout_closed = StopSignals(), False
        self.deadline, self.stop_file = deadline, None if stop_file is None else Path(stop_file)
        self._start = None  # where the run was when the time limit was first asked for

    def __enter__(self):
        self.signals.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self.signals.__exit__(*exc_info)

    def critical(self, raise_pending: bool = True):
        """A section a second signal does not cut (``StopSignals.critical``)."""
        return self.signals.critical(raise_pending=raise_pending)

    def check_signals(self, run) -> None:
        """Raise Interrupted where a stop signal arrived, stdout was closed or the stop file exists."""
        if self.stdout_closed:
            raise Interrupted(signal.SIGPIPE)
        self.signals.check()
        if self.stop_file is not None and self.stop_file.exists():
            raise Interrupted(signal.SIGINT)

    def deadline_now(self, position):
        """The time limit in force at ``position`` ((epoch, step)): None until the run has moved on
        from where it was when first asked."""
        if self.deadline is None:
            return None
        if self._start is None:
            self._start = position
        return None if position == self._start else self.deadline

    @staticmethod
    def check_deadline(deadline, clock=time.monotonic) -> None:
        """TimeLimitReached once ``deadline`` (a ``clock()`` value, or None) has passed; the clock is
        read only where there is a deadline."""
        if deadline is not None and clock() >= deadline:
            raise TimeLimitReached()

    def resume_command(self, run) -> str:
        """The command that continues ``run`` (its options come from its config.json)."""
        return f"tinygrad-caps train --resume --out {shlex.quote(str(run.out_dir))}"
