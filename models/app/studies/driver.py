"""The driver of a study whose runs train outside its process: it hands the runs that have not
finished to an executor (``local_executor.LocalExecutor``: worker processes; ``ray_executor.RayExecutor``:
Ray tasks), as many at a time as the executor takes, and follows them to the end.

- A run that fails does not stop the others; the result lists it, with its last error line.
- A run whose process was killed (a signal, the OOM killer) is started again, up to ``max_retries``
  times, and continues from its ``last.npz`` (Ray retries its own tasks, and reports a run only once
  its retries are spent).
- The time limit (``deadline``) is every run's: the runs save at their next batch boundary after it,
  and no run starts after it (but the first run of the call, which trains at least one batch).
- Ctrl-C (SIGINT) or SIGTERM writes DIR/study.stop: every running run saves at its next batch
  boundary and ends, the driver waits for them, then raises Interrupted (a second Ctrl-C stops them
  at once: they continue from their last checkpoint).
"""
from __future__ import annotations

import contextlib
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..training.run_state import Interrupted, write_text_atomically
from .run_task import STOP_FILE, run_status
from .runner import continue_command
from .study_progress import StudyProgress

POLL_SECONDS = 0.5


@dataclass(frozen=True)
class PendingRun:
    """One run of the plan for an executor: its configuration, seed, folder and label."""

    config_id: str
    seed: int
    run_dir: Path

    @property
    def label(self) -> str:
        return f"{self.config_id} seed {self.seed}"


def plan_runs(plan: dict, out) -> list:
    """Every run of ``plan`` as a PendingRun, in the plan's order (configurations, then seeds)."""
    return [PendingRun(config["config_id"], run["seed"], Path(out) / run["path"])
            for config in plan["configs"] for run in config["runs"]]


def drive_runs(plan: dict, out, executor, deadline=None, show_progress=False, max_retries: int = 3,
               clock=time.monotonic, resume_command=None) -> dict:
    """Train every unfinished run of ``plan`` with ``executor``; returns {"finished", "total",
    "stopped", "failed": the outcomes of the failed runs} as ``runner.train_runs`` does. Raises
    Interrupted after Ctrl-C, once every running run has saved, saying how to continue
    (``resume_command``, default ``continue_command(plan, out)``)."""
    out = Path(out)
    resume_command = resume_command or continue_command(plan, out)
    runs = plan_runs(plan, out)
    progress = StudyProgress([(run.label, run.run_dir) for run in runs], plan["epochs"], show_progress)
    pending, finished = [], 0
    for run in runs:
        if run_status(run.run_dir, plan["epochs"]) == "finished":
            finished += 1
            progress.finished.add(run.label)
        else:
            pending.append(run)
    stop_path = out / STOP_FILE
    stop_path.unlink(missing_ok=True)  # (left by a driver that was killed while stopping)
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
                    retry = f" (retry {attempts[run.label]} of {max_retries})" if attempts.get(run.label) else ""
                    text = f"[{run.label}] {executor.start_verb}{retry}: {run.run_dir}"
                    if executor.running_once_started:
                        progress.run_started(run.label, text)
                    else:  # (a Ray task: running once it holds its run lock, said by note_started)
                        progress.running.add(run.label)
                        progress.event(text)
                if not executor.running():  # (all done, or none may start: the time limit, a stop)
                    break
                for run, outcome in executor.wait(POLL_SECONDS):
                    progress.running.discard(run.label)
                    progress.training.discard(run.label)
                    status = outcome["status"]
                    if status == "finished":
                        finished += 1
                        progress.finished.add(run.label)
                        progress.event(f"[{run.label}] finished")
                    elif status == "stopped":
                        stopped = True
                    elif status == "interrupted":
                        pending.insert(0, run)  # (not counted: a later --resume continues it)
                    elif status == "killed" and attempts.get(run.label, 0) < max_retries and interrupted is None:
                        attempts[run.label] = attempts.get(run.label, 0) + 1
                        progress.event(f"[{run.label}] {outcome['error']}; starting it again from its last checkpoint")
                        pending.insert(0, run)
                    else:
                        failed.append(outcome)
                        progress.failed.add(run.label)
                        progress.event(f"[{run.label}] failed: {outcome['error']}")
                progress.note_started()
                progress.refresh()
            except KeyboardInterrupt as exc:
                if interrupted is not None:  # a second one: stop at once
                    executor.kill_all()
                    progress.close()
                    print(f"study stopped at once; continue it with: {resume_command}", file=sys.stderr)
                    raise Interrupted(getattr(exc, "signum", signal.SIGINT)) from None
                interrupted = getattr(exc, "signum", signal.SIGINT)
                write_text_atomically(stop_path, "stop\n")
                progress.event(f"stopping: every running run saves at its next batch boundary "
                               f"({len(executor.running())} running)")
    progress.close()
    stop_path.unlink(missing_ok=True)
    if interrupted is not None:
        print(f"study stopped; continue it with: {resume_command}", file=sys.stderr)
        raise Interrupted(interrupted)
    return {"finished": finished, "total": len(runs), "stopped": stopped or bool(pending), "failed": failed}


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


def exit_reason(returncode: int) -> str:
    """"killed by SIGKILL" for a negative return code, else "exit status N"."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def print_failures(result: dict, stream=None) -> None:
    """One line per failed run of ``result``: its configuration, seed and last error line."""
    stream = stream or sys.stdout
    for outcome in result["failed"]:
        print(f"failed: {outcome['config_id']} seed {outcome['seed']}: {outcome['error']}", file=stream)
