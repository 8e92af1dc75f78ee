"""The one scheduling loop of a study: the driver hands the runs that have not finished to an
executor (``in_process_executor.InProcessExecutor``: one at a time in this process, the default;
``local_executor.LocalExecutor``: worker processes; ``ray_executor.RayExecutor``: Ray tasks), as
many at a time as the executor takes, and follows them to the end, whatever the executor.

- A run that fails does not stop the others; the result lists it, with the reason it failed.
- A run whose process was killed (a signal, the OOM killer) is started again, up to ``max_retries``
  times, and continues from its ``last.npz`` (Ray retries its own tasks, and reports a run only once
  its retries are spent).
- The time limit (``deadline``) is every run's: the runs save at their next batch boundary after it,
  and no run starts after it (but the first run of the call, which trains at least one batch).
- Ctrl-C (SIGINT) or SIGTERM writes DIR/study.stop: every running run saves at its next batch
  boundary and ends, the driver waits for them, then raises Interrupted (a second Ctrl-C stops them
  at once: they continue from their last checkpoint). A run in the driver's own process takes the
  signal itself: it saves, and the study stops after it.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import time
from dataclasses import dataclass

from ..training.run_state import Interrupted, write_text_atomically
from .folder import StudyFolder
from .outcome import Outcome
from .run_task import run_status

POLL_SECONDS = 0.5


@dataclass(frozen=True)
class StudyResult:
    """What one call of ``drive_runs`` did: the runs finished (before or now) of the ``total`` planned,
    whether the time limit stopped the study (``stopped``: runs are left), and the RunResults of the
    runs that failed."""

    finished: int
    total: int
    stopped: bool
    failed: tuple = ()


def drive_runs(plan, folder, executor, *, deadline=None, show_progress=False, max_retries: int = 3,
               clock=None, resume_command=None) -> StudyResult:
    """Train every unfinished run of ``plan`` (a StudyPlan) of the study ``folder`` with ``executor``
    (see the module docstring); returns the StudyResult. ``deadline``: a ``clock()`` value (default
    clock: time.monotonic). Raises Interrupted after Ctrl-C, once every running run has saved,
    saying how to continue (``resume_command``, default ``plan.continue_command(folder)``)."""
    folder = StudyFolder.of(folder)
    clock = clock or time.monotonic
    resume_command = resume_command or plan.continue_command(folder)
    runs = plan.runs()
    lines = executor.progress(runs, folder, plan.epochs, show_progress)
    pending, finished = [], 0
    for run in runs:
        if run_status(folder.run(run.config_id, run.seed), plan.epochs) == "finished":
            finished += 1
            lines.run_was_finished(run)
        else:
            pending.append(run)
    folder.stop.unlink(missing_ok=True)  # (left by a driver that was killed while stopping)
    failed, stopped, attempts, started_any = [], False, {}, False
    interrupted = None
    with _sigterm_as_interrupt():
        while pending or executor.running():
            try:
                while (pending and interrupted is None and executor.has_room()
                       and not (started_any and (stopped or (deadline is not None and clock() >= deadline)))):
                    run = pending.pop(0)
                    executor.start(run, deadline, must_train=not started_any)
                    started_any = True
                    retry = f" (retry {attempts[run]} of {max_retries})" if attempts.get(run) else ""
                    lines.run_handed_over(run, folder.run(run.config_id, run.seed).path, retry)
                if not executor.running():  # (all done, or none may start: the time limit, a stop)
                    break
                for result in executor.wait(POLL_SECONDS):
                    run = result.run
                    lines.run_ended(run)
                    if result.outcome is Outcome.FINISHED:
                        finished += 1
                        lines.run_finished(run)
                    elif result.outcome is Outcome.STOPPED:
                        stopped = True
                    elif result.outcome is Outcome.INTERRUPTED:
                        pending.insert(0, run)  # (not counted: a later --resume continues it)
                        if executor.shares_signals and interrupted is None:  # the run took the study's Ctrl-C
                            interrupted = result.signum or int(signal.SIGINT)
                    elif result.killed and attempts.get(run, 0) < max_retries and interrupted is None:
                        attempts[run] = attempts.get(run, 0) + 1
                        lines.run_retried(run, result.reason)
                        pending.insert(0, run)
                    else:
                        failed.append(result)
                        lines.run_failed(run, result.reason)
                lines.poll()
            except KeyboardInterrupt as exc:
                if interrupted is not None:  # a second one: stop at once
                    executor.kill_all()
                    lines.close()
                    print(f"study stopped at once; continue it with: {resume_command}", file=sys.stderr)
                    raise Interrupted(getattr(exc, "signum", signal.SIGINT)) from None
                interrupted = getattr(exc, "signum", signal.SIGINT)
                write_text_atomically(folder.stop, "stop\n")
                lines.stopping(len(executor.running()))
    lines.close()
    folder.stop.unlink(missing_ok=True)
    if interrupted is not None:
        print(f"study stopped; continue it with: {resume_command}", file=sys.stderr)
        raise Interrupted(interrupted)
    return StudyResult(finished, len(runs), stopped or bool(pending), tuple(failed))


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Within the block, SIGTERM stops the study as Ctrl-C does (main thread only)."""
    def handler(signum, frame):
        raise Interrupted(signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def print_failures(result: StudyResult, stream=None) -> None:
    """One line per failed run of ``result``: its configuration, seed and the reason it failed."""
    stream = stream or sys.stdout
    for failure in result.failed:
        print(f"failed: {failure.run.config_id} seed {failure.run.seed}: {failure.reason}", file=stream)
