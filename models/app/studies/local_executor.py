"""The local executor: each run in a worker process of its own (``worker.py``), as many at a time as
the placement has slots, each with its threads (``Placement.thread_environment``) and, on GPUs, its
device. A run's output (its log lines, a traceback) goes to RUN/train.log.

The workers run in sessions of their own, so a Ctrl-C at the terminal reaches the driver alone,
which stops them through DIR/study.stop (``driver.drive_runs``); they die with the driver.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from ..training.run_folder import RunFolder
from .driver import exit_reason
from .run_task import read_failure
from .worker import FAILED_PREFIX

EXIT_STOPPED, EXIT_FAILED = 75, 1
EXIT_INTERRUPTED = (130, 143)


class LocalExecutor:
    """Runs of one study in worker processes on this machine (see the module docstring)."""

    retries_runs = True  # the driver starts a killed run again (Ray retries its tasks itself)
    start_verb = "started"
    running_once_started = True  # a run's process trains it from its start

    def __init__(self, out, placement):
        self.out, self.placement = out, placement
        self.free_slots = list(placement.devices) if placement.devices else [None] * placement.jobs
        self.processes = {}  # PendingRun -> (Popen, slot, log file)

    def prepare(self) -> None:
        """Nothing to check before the plan is written: the workers share this machine's folders."""

    def has_room(self) -> bool:
        """Whether another run may start now."""
        return bool(self.free_slots)

    def running(self) -> list:
        """The runs whose processes have not ended (or not been collected by ``wait``)."""
        return list(self.processes)

    def start(self, run, deadline=None, must_train=False) -> None:
        """Start ``run``'s worker process on a free slot."""
        slot = self.free_slots.pop(0)
        command = [sys.executable, "-m", "tinygrad_caps.models.app.studies.worker", str(self.out), run.config_id,
                   str(run.seed), "--parent", str(os.getpid())]
        if slot is not None:
            command += ["--device", slot]
        if deadline is not None:
            command += ["--deadline-in", repr(max(0.0, deadline - time.monotonic()))]
        if must_train:
            command.append("--first")
        if self.placement.threads_given:  # (else a run takes its own count: the environment's, or on resume its config's)
            command += ["--threads", str(self.placement.threads)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.placement.thread_environment())
        log_path = RunFolder(run.run_dir).train_log
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")
        try:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=env, start_new_session=True)
        except BaseException:
            log.close()
            self.free_slots.insert(0, slot)
            raise
        self.processes[run] = (process, slot, log)

    def wait(self, timeout: float) -> list:
        """The runs whose processes ended within ``timeout`` seconds, each with its outcome."""
        end = time.monotonic() + timeout
        while True:
            ended = [(run, entry) for run, entry in self.processes.items() if entry[0].poll() is not None]
            if ended or time.monotonic() >= end:
                break
            time.sleep(0.05)
        outcomes = []
        for run, (process, slot, log) in ended:
            del self.processes[run]
            log.close()
            self.free_slots.append(slot)
            outcomes.append((run, self._outcome(run, process.returncode)))
        return outcomes

    def kill_all(self) -> None:
        """Kill every running worker at once (they continue from their last checkpoint on resume)."""
        for process, _, log in self.processes.values():
            process.kill()
            process.wait()
            log.close()
        self.processes.clear()

    def close(self) -> None:
        """Nothing to release beyond ``kill_all`` (the driver waits for its runs)."""
        self.kill_all()

    def _outcome(self, run, returncode: int) -> dict:
        outcome = {"config_id": run.config_id, "seed": run.seed, "returncode": returncode}
        if returncode == 0:
            return dict(outcome, status="finished")
        if returncode == EXIT_STOPPED:
            return dict(outcome, status="stopped")
        if returncode in EXIT_INTERRUPTED:
            return dict(outcome, status="interrupted")
        if returncode < 0:
            return dict(outcome, status="killed", error=f"its process was {exit_reason(returncode)}")
        failure = read_failure(run.run_dir) if returncode == EXIT_FAILED else None
        said = last_line(RunFolder(run.run_dir).train_log)
        if failure is not None:
            error = failure["error"]
        elif returncode == EXIT_FAILED and said.startswith(FAILED_PREFIX):  # (a failure the run folder does not record)
            error = said[len(FAILED_PREFIX):]
        else:
            error = f"its process ended with {exit_reason(returncode)}: {said}"
        return dict(outcome, status="failed", error=error)


def last_line(path) -> str:
    """The last non-empty line of the text file ``path`` ("" where there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""
