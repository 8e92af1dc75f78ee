"""How one run of a study ended, said once: the ``Outcome`` (with the worker's exit status for it),
the failure a run folder records (RUN/failed.json, ``Failure``) and the result an executor hands
the driver (``RunResult``: the outcome with its reason as data, never read back from a log line).

    outcome      exit status   what happened
    FINISHED     0             the run has trained every epoch of the plan (now or before)
    FAILED       1             an exception (a user's error, a divergence, a bug); the reason is its
                               one line, and RUN/failed.json records it for the summary and --resume
    UNREACHABLE  2             (Ray) the node cannot see the study folder (DIR/study.token)
    STOPPED      EX_TEMPFAIL   the study's time limit stopped it at a batch boundary; last.npz saved
    INTERRUPTED  128 + signal  the study was asked to stop (Ctrl-C, DIR/study.stop, SIGTERM); saved

EX_TEMPFAIL is sysexits.h's "try again later": ``study run`` exits with it too where its time limit
stopped it, and a job script runs the same command again until the status is another.
"""
from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import os
import signal
import socket
from dataclasses import dataclass

from ..training.run_folder import RunFolder
from ..training.run_state import write_text_atomically

EX_TEMPFAIL = 75  # sysexits.h: a temporary failure; the one place this number is written


class Outcome(enum.Enum):
    """How one run of a study ended, and the worker's exit status for it (the module docstring)."""

    FINISHED = "finished"
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"

    @property
    def exit_code(self) -> int:
        """The exit status of a process whose run ended so (INTERRUPTED: 128 + SIGINT)."""
        return EXIT_CODES[self]

    @classmethod
    def from_exit_code(cls, code: int) -> "Outcome":
        """The outcome of exit status ``code``: 0, 1, 2, EX_TEMPFAIL, and 128 + SIGINT or SIGTERM for
        INTERRUPTED; ValueError for any other status (a negative one: the process was killed)."""
        for outcome, status in EXIT_CODES.items():
            if status == code:
                return outcome
        if code in INTERRUPTED_CODES:
            return cls.INTERRUPTED
        raise ValueError(f"no outcome of a study's run has the exit status {code} ({describe_exit(code)})")


EXIT_CODES = {Outcome.FINISHED: 0, Outcome.FAILED: 1, Outcome.UNREACHABLE: 2, Outcome.STOPPED: EX_TEMPFAIL,
              Outcome.INTERRUPTED: 128 + signal.SIGINT}
INTERRUPTED_CODES = (128 + signal.SIGINT, 128 + signal.SIGTERM)


@dataclass(frozen=True)
class Failure:
    """RUN/failed.json: a study's run's last failure (its one error line, the host and process and
    the time), written where it failed and removed when it trains again."""

    error: str
    host: str = ""
    pid: int | None = None
    time: str = ""

    @classmethod
    def now(cls, error: str) -> "Failure":
        """The failure ``error`` of this process, now."""
        return cls(error, socket.gethostname(), os.getpid(),
                   datetime.datetime.now().astimezone().isoformat(timespec="seconds"))

    @classmethod
    def read(cls, run) -> "Failure | None":
        """The failure ``run`` (a RunFolder or its path) records, or None where it records none
        (no failed.json, or one without an error line)."""
        try:
            record = json.loads(_run_folder(run).failed.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or not isinstance(record.get("error"), str):
            return None
        pid = record.get("pid")
        return cls(record["error"], str(record.get("host") or ""), pid if isinstance(pid, int) else None,
                   str(record.get("time") or ""))

    def write(self, run) -> None:
        """Write RUN/failed.json (best effort: a full disk loses it; the driver has the reason anyway)."""
        folder = _run_folder(run)
        record = {"error": self.error, "host": self.host, "pid": self.pid, "time": self.time}
        try:
            folder.path.mkdir(parents=True, exist_ok=True)
            write_text_atomically(folder.failed, json.dumps(record) + "\n")
        except OSError:
            pass


@dataclass(frozen=True)
class RunResult:
    """One run's outcome with its data: the run (a ``plan.PlannedRun``), the outcome, the reason
    (FAILED, UNREACHABLE: one line), the host it ran on, the signal that interrupted it, and whether
    its process was killed (a signal, the OOM killer: the driver may start it again)."""

    run: object
    outcome: Outcome
    reason: str | None = None
    host: str = ""
    signum: int | None = None
    killed: bool = False

    @property
    def exit_code(self) -> int:
        """The worker's exit status: ``outcome.exit_code``; 128 + signum for INTERRUPTED."""
        if self.outcome is Outcome.INTERRUPTED and self.signum is not None:
            return 128 + self.signum
        return self.outcome.exit_code

    def to_json(self) -> str:
        """The result as one line of JSON (the run is the reader's: it knows which run it started)."""
        return json.dumps({"outcome": self.outcome.value, "reason": self.reason, "host": self.host,
                           "signum": self.signum, "killed": self.killed})

    @classmethod
    def from_json(cls, text: str, run) -> "RunResult":
        """The result ``to_json`` wrote, for ``run``; ValueError where ``text`` is not one."""
        record = json.loads(text)
        if not isinstance(record, dict):
            raise ValueError(f"a run's result is a JSON object, got {text[:80]!r}")
        reason, signum = record.get("reason"), record.get("signum")
        return cls(run, Outcome(record.get("outcome")), reason if isinstance(reason, str) else None,
                   str(record.get("host") or ""), signum if isinstance(signum, int) else None,
                   bool(record.get("killed")))

    def with_run(self, run) -> "RunResult":
        """This result for ``run`` (the driver's own object for the run it started)."""
        return dataclasses.replace(self, run=run)


def describe_exit(returncode: int) -> str:
    """"killed by SIGKILL" for a negative return code (a process killed by a signal), else "exit status N"."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _run_folder(run) -> RunFolder:
    return run if isinstance(run, RunFolder) else RunFolder(run)
