"""One run of a study, trained wherever an executor puts it: in the driver's process (``--jobs 1``,
``in_process_executor``), in a worker process of the local executor, or in a Ray task on any node
of a cluster.

``train_study_run(out, config_id, seed)`` reads the plan (``StudyPlan.load``), claims the run folder
(RUN/run.lock: no run is ever trained by two processes), continues it from its ``last.npz`` where it
has one, and returns a ``RunResult`` (its ``Outcome``, with the failure's one line as its reason)
instead of raising, so that one run's failure never stops the others. A failed run also records its
failure in RUN/failed.json (``outcome.Failure``) for the summary and for ``--resume``, which retries
it; a run held by another process has not failed, and records nothing.

The study folder's files this module reads: DIR/study.stop (written by the driver to stop every run
at its next batch boundary) and DIR/study.token (written by a Ray driver; every task checks it, so a
node without the shared storage fails in one line instead of training into a folder of its own).
"""
from __future__ import annotations

import signal
import socket
import time
import traceback

import tinygrad_caps as tc

from ...errors import UsageError
from ..training.option_checks import device_or_usage_error
from ..training.reporting import is_user_error, one_line
from ..training.run_folder import RunFolder
from ..training.run_state import Interrupted, TimeLimitReached
from .folder import StudyFolder
from .lock import LockHeld, run_lock
from .outcome import Failure, Outcome, RunResult
from .plan import PlannedRun, StudyPlan


class StorageNotShared(UsageError):
    """This host cannot see the study folder the driver wrote (no shared storage)."""


def run_status(run, epochs: int) -> str:
    """"finished" (its checkpoint has committed ``epochs`` epochs or more: a run taken further by an
    earlier, longer plan is finished for a shorter one), "started" (a checkpoint to resume) or "new".
    ``run``: a RunFolder, or its path."""
    last = (run if isinstance(run, RunFolder) else RunFolder(run)).last
    if not last.exists():
        return "new"
    return "finished" if tc.load(last)["progress"]["epoch"] >= epochs else "started"


def check_token(out, token) -> None:
    """StorageNotShared unless DIR/study.token holds ``token`` (a check that this host sees the
    folder the driver wrote, not a folder of the same name of its own)."""
    folder = StudyFolder.of(out)
    path = folder.token
    try:
        seen = path.read_text().strip()
    except OSError:
        seen = None
    if seen != token:
        why = "does not exist" if seen is None else "holds another study's token"
        raise StorageNotShared(f"node {socket.gethostname()} cannot see the study folder {folder} ({path} {why} "
                               "there): a study folder must be on storage every node sees (NFS, Lustre, a shared "
                               "volume)")


def train_study_run(out, config_id: str, seed: int, *, deadline=None, device=None, token=None, log=print,
                    show_progress=False, skip_after_deadline=False, lock_wait=0.0, threads=None) -> RunResult:
    """Train (or continue) the run ``config_id``/``seed`` of the study in ``out`` (a StudyFolder or its
    path); returns its RunResult (see the module docstring and ``outcome.Outcome``).

    ``deadline``: a time.monotonic() value (of this host) after which the run saves at its next batch
    boundary (it trains one batch first, unless ``skip_after_deadline`` and the time has passed before
    it began).
    ``device``: the device to train on instead of the plan's (the executor's placement). ``threads``:
    the run's thread count where ``--threads-per-run`` gave one (else a new run takes the process's,
    ``threads.default_threads()``, and a started one its own, from its checkpoint). ``token``:
    the value DIR/study.token must hold (Ray). ``lock_wait``: seconds to wait for a run lock held by
    a process that may be gone (a retried task). ``log``: where the Trainer's lines go.
    """
    folder, seed = StudyFolder.of(out), int(seed)
    planned, host = PlannedRun(config_id, seed, StudyFolder.run_path(config_id, seed)), socket.gethostname()
    run = folder.run(config_id, seed)

    def ended(outcome: Outcome, **data) -> RunResult:
        return RunResult(planned, outcome, host=host, **data)

    try:
        if token is not None:
            check_token(folder, token)
        plan = StudyPlan.load(folder)
        if plan is None:
            raise UsageError(f"{folder} holds no {folder.plan_file.name}")
        found = plan.find_run(config_id, seed)
        if found is None:
            raise UsageError(f"the study in {folder} has no run {config_id} seed {seed}")
        planned = found
        if run_status(run, plan.epochs) == "finished":
            return ended(Outcome.FINISHED)
        if folder.stop.exists():  # (the driver has asked every run to stop)
            return ended(Outcome.INTERRUPTED)
        if skip_after_deadline and deadline is not None and time.monotonic() >= deadline:
            return ended(Outcome.STOPPED)
        with run_lock(run, lock_wait):
            status = run_status(run, plan.epochs)  # another process may have finished it meanwhile
            if status == "finished":
                return ended(Outcome.FINISHED)
            run.failed.unlink(missing_ok=True)
            config = plan.run_config(planned)
            changes = {**({"device": device} if device is not None else {}),
                       **({"threads": threads} if threads is not None else {})}
            if changes:
                config = _with_changes(config, changes)
            _train(config, run, folder, status == "started", deadline, show_progress, log)
        return ended(Outcome.FINISHED)
    except StorageNotShared as exc:
        return ended(Outcome.UNREACHABLE, reason=one_line(exc))
    except TimeLimitReached:
        return ended(Outcome.STOPPED)
    except Interrupted as exc:
        return ended(Outcome.INTERRUPTED, signum=int(exc.signum))
    except KeyboardInterrupt:
        return ended(Outcome.INTERRUPTED, signum=int(signal.SIGINT))
    except Exception as exc:  # noqa: BLE001  (any failure of one run is reported, and the others go on)
        error = one_line(exc)
        if not is_user_error(exc):  # a bug: its traceback goes to the run's log
            log("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip())
        if not isinstance(exc, LockHeld):  # (another process's run has not failed)
            Failure.now(error).write(run)
        return ended(Outcome.FAILED, reason=error)


def _with_changes(config, changes: dict):
    """``config`` with the executor's ``changes`` (device, threads), checked as the Trainer checks options."""
    from ..training.trainer import training_config

    return training_config(config, **changes)


def _train(config, run: RunFolder, folder: StudyFolder, resume, deadline, show_progress, log) -> None:
    """Build the study's Trainer for the run folder ``run`` and train it."""
    with tc.backend.on_device(device_or_usage_error(config.device)):
        trainer = study_trainer_class()(config, run, resume=resume, show_progress=show_progress, log=log)
        trainer.deadline = deadline
        trainer.stop_file = folder.stop
        trainer.run()


def study_trainer_class():
    """The ``Trainer`` a study trains its runs with. Its time limit (``deadline``) applies only once
    the run has moved on from where it started (a batch trained, or an epoch's test pass committed),
    so every call of a time-limited study makes progress, however short the limit; and a
    ``stop_file`` (DIR/study.stop) that appears stops it at the next batch boundary as Ctrl-C does."""
    from ..training.trainer import Trainer  # the trainer (and the dataset code) only when a run trains

    class StudyTrainer(Trainer):
        """A Trainer whose time limit waits for the run's first step and that obeys the study's stop file."""

        _time_limit = None
        _started_at = None
        stop_file = None

        @property
        def deadline(self):
            """None until the run has moved on from where it started, then the time limit."""
            state = getattr(self, "state", None)
            if state is None:  # (still being set up: nothing has trained)
                return None
            position = (state["epoch"], state["step"])
            if self._started_at is None:
                self._started_at = position
            return None if position == self._started_at else self._time_limit

        @deadline.setter
        def deadline(self, value):
            """Set the time limit (a time.monotonic() value, or None)."""
            self._time_limit = value

        def _check_signals(self, stop) -> None:
            """Trainer's check, then the study's stop file (the driver's Ctrl-C, seen by every node)."""
            super()._check_signals(stop)
            if self.stop_file is not None and self.stop_file.exists():
                raise Interrupted(signal.SIGINT)

    return StudyTrainer
