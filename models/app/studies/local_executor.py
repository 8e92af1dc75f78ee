"""The local executor: each run in a worker process of its own (``worker.py``), as many at a time as
the placement has slots, each with its threads (``Placement.thread_environment``) and, on GPUs, its
device. A run's output (its log lines, a traceback) goes to RUN/train.log; its result comes back as
one line of JSON on a pipe of its own (``outcome.RunResult``), so the reason of a failure is data,
never a log line read back.

The workers run in sessions of their own, so a Ctrl-C at the terminal reaches the driver alone,
which stops them through DIR/study.stop (``driver.drive_runs``); they die with the driver.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from .folder import StudyFolder
from .outcome import Failure, Outcome, RunResult, describe_exit
from .study_progress import StudyProgress


@dataclass
class _Worker:
    """A run's worker process: its slot, its log file, and the pipe its result comes on."""

    process: subprocess.Popen
    slot: object
    log: object
    result_fd: int
    received: list = field(default_factory=list)

    def drain(self) -> None:
        """Read what the pipe holds now (a worker never blocks on a full pipe)."""
        while True:
            try:
                chunk = os.read(self.result_fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                return
            if not chunk:
                return
            self.received.append(chunk)

    def close(self) -> None:
        """Close the log file and the pipe."""
        self.log.close()
        try:
            os.close(self.result_fd)
        except OSError:
            pass


class LocalExecutor:
    """Runs of one study in worker processes on this machine (see the module docstring)."""

    retries_runs = True  # the driver starts a killed run again (Ray retries its tasks itself)
    start_verb = "started"
    running_once_started = True  # a run's process trains it from its start
    shares_signals = False  # the workers have sessions of their own: a Ctrl-C reaches the driver alone

    def __init__(self, folder, placement):
        self.folder, self.placement = StudyFolder.of(folder), placement
        self.free_slots = list(placement.devices) if placement.devices else [None] * placement.jobs
        self.processes = {}  # PlannedRun -> _Worker

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
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        command = [sys.executable, "-m", "tinygrad_caps.models.app.studies.worker", str(self.folder), run.config_id,
                   str(run.seed), "--parent", str(os.getpid()), "--result-fd", str(write_fd)]
        if slot is not None:
            command += ["--device", slot]
        if deadline is not None:
            command += ["--deadline-in", repr(max(0.0, deadline - time.monotonic()))]
        if must_train:
            command.append("--first")
        if self.placement.threads_given:  # (else a run takes its own count: the environment's, or on resume its config's)
            command += ["--threads", str(self.placement.threads)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.placement.thread_environment())
        log_path = self.folder.run(run.config_id, run.seed).train_log
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(log_path, "ab")
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            self.free_slots.insert(0, slot)
            raise
        try:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=env, start_new_session=True, pass_fds=(write_fd,))
        except BaseException:
            log.close()
            os.close(read_fd)
            self.free_slots.insert(0, slot)
            raise
        finally:
            os.close(write_fd)  # (the worker holds its end; the pipe ends when the worker does)
        self.processes[run] = _Worker(process, slot, log, read_fd)

    def wait(self, timeout: float) -> list:
        """The RunResults of the runs whose processes ended within ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while True:
            for worker in self.processes.values():
                worker.drain()
            ended = [(run, worker) for run, worker in self.processes.items() if worker.process.poll() is not None]
            if ended or time.monotonic() >= end:
                break
            time.sleep(0.05)
        results = []
        for run, worker in ended:
            del self.processes[run]
            worker.drain()
            worker.close()
            self.free_slots.append(worker.slot)
            results.append(self._result(run, worker.process.returncode, b"".join(worker.received)))
        return results

    def kill_all(self) -> None:
        """Kill every running worker at once (they continue from their last checkpoint on resume)."""
        for worker in self.processes.values():
            worker.process.kill()
            worker.process.wait()
            worker.close()
        self.processes.clear()

    def close(self) -> None:
        """Nothing to release beyond ``kill_all`` (the driver waits for its runs)."""
        self.kill_all()

    def progress(self, runs, folder, epochs: int, show: bool) -> StudyProgress:
        """The study's lines: each run's "started", "finished" and "failed" lines and the progress line."""
        return StudyProgress.of_runs(runs, folder, epochs, show, start_verb=self.start_verb,
                                     running_once_started=self.running_once_started)

    def _result(self, run, returncode: int, received: bytes) -> RunResult:
        """The result of ``run``'s worker: the one it sent, else what its exit status says (its
        process killed by a signal: a result the driver may retry)."""
        if returncode < 0:
            return RunResult(run, Outcome.FAILED, reason=f"its process was {describe_exit(returncode)}", killed=True)
        lines = received.decode("utf-8", "replace").splitlines()
        if lines:
            try:
                return RunResult.from_json(lines[-1], run)
            except ValueError:
                pass
        try:
            outcome = Outcome.from_exit_code(returncode)
        except ValueError:
            outcome = None
        if outcome in (Outcome.FINISHED, Outcome.STOPPED, Outcome.INTERRUPTED):
            return RunResult(run, outcome, signum=returncode - 128 if outcome is Outcome.INTERRUPTED else None)
        failure = Failure.read(self.folder.run(run.config_id, run.seed)) if outcome is Outcome.FAILED else None
        if failure is not None:
            return RunResult(run, Outcome.FAILED, reason=failure.error)
        log = self.folder.run(run.config_id, run.seed).train_log
        return RunResult(run, Outcome.FAILED, reason=f"its process ended with {describe_exit(returncode)} "
                                                     f"before it said why (its output: {log})")
