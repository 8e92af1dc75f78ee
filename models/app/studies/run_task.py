"""One run of a study, trained wherever an executor puts it: in the driver's process (``--jobs 1``),
in a worker process of the local executor, or in a Ray task on any node of a cluster.

``train_study_run(out, config_id, seed)`` reads the plan from DIR/study.json, claims the run folder
(RUN/run.lock: no run is ever trained by two processes), continues it from its ``last.npz`` where it
has one, and returns an outcome instead of raising, so that one run's failure never stops the
others. The outcomes ({"status": ...}):

    finished     the run has trained every epoch of the plan (now or before)
    stopped      the study's time limit stopped it at a batch boundary; last.npz is saved
    interrupted  the study was asked to stop (Ctrl-C: DIR/study.stop, or a signal); last.npz is saved
    failed       an exception (a user's error, a divergence, a bug); "error" holds its one line and
                 RUN/failed.json records it for the summary and for ``--resume``, which retries it
    unreachable  (Ray) the node cannot see the study folder: DIR/study.token is missing or differs

Files of a study folder this module names: DIR/study.stop (written by the driver to stop every run
at its next batch boundary) and DIR/study.token (written by a Ray driver; every task checks it, so a
node without the shared storage fails in one line instead of training into a folder of its own).
"""
from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import time
import traceback
from pathlib import Path

import tinygrad_caps as tc

from ...errors import UsageError
from ..training.option_checks import device_or_usage_error
from ..training.reporting import is_user_error, one_line
from ..training.run_folder import RunFolder
from ..training.run_state import Interrupted, TimeLimitReached, write_text_atomically
from .lock import LockHeld, run_lock
from .plan_file import load_plan

STUDY_FILE = "study.json"
STOP_FILE = "study.stop"
TOKEN_FILE = "study.token"
FAILED_FILE = "failed.json"


class StorageNotShared(UsageError):
    """This host cannot see the study folder the driver wrote (no shared storage)."""


def run_path(config_id: str, seed: int) -> str:
    """A run's folder, relative to the study's: ``runs/<config_id>/seed-<seed>``."""
    return f"runs/{config_id}/seed-{seed}"


def failure_path(run_dir) -> Path:
    """RUN/failed.json: the last failure of a study's run (removed when it trains again)."""
    return Path(run_dir) / FAILED_FILE


def read_failure(run_dir):
    """The failure record of ``run_dir`` ({"error", "host", "time"}), or None where it has none."""
    try:
        record = json.loads(failure_path(run_dir).read_text())
    except (FileNotFoundError, ValueError, OSError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("error"), str) else None


def run_config(plan: dict, config: dict, seed: int) -> dict:
    """The options one run trains with: the study's shared options, the configuration's own, the
    epochs and the seed, with only the chosen model's options (as ``train`` records them)."""
    from ..training.run_options import model_options

    options = {"model": "capsnet", **plan["options"]}  # a study may train another model for all its runs
    options.update(config["options"], epochs=plan["epochs"], seed=seed)
    if options.get("augment") == "none":
        options["augment"] = None
    return model_options(options, explicit=set())


def run_status(run_dir: Path, epochs: int) -> str:
    """"finished" (its checkpoint has committed ``epochs`` epochs or more: a run taken further by an
    earlier, longer plan is finished for a shorter one), "started" (a checkpoint to resume) or "new"."""
    last = RunFolder(run_dir).last
    if not last.exists():
        return "new"
    return "finished" if tc.load(last)["progress"]["epoch"] >= epochs else "started"


def check_token(out, token) -> None:
    """StorageNotShared unless DIR/study.token holds ``token`` (a check that this host sees the
    folder the driver wrote, not a folder of the same name of its own)."""
    path = Path(out) / TOKEN_FILE
    try:
        seen = path.read_text().strip()
    except OSError:
        seen = None
    if seen != token:
        why = "does not exist" if seen is None else "holds another study's token"
        raise StorageNotShared(f"node {socket.gethostname()} cannot see the study folder {out} ({path} {why} there): "
                               "a study folder must be on storage every node sees (NFS, Lustre, a shared volume)")


def stop_requested(out) -> bool:
    """Whether the driver has asked every run of the study in ``out`` to stop (DIR/study.stop)."""
    return (Path(out) / STOP_FILE).exists()


def train_study_run(out, config_id: str, seed: int, *, deadline=None, device=None, token=None, log=print,
                    show_progress=False, skip_after_deadline=False, lock_wait=0.0, threads=None) -> dict:
    """Train (or continue) the run ``config_id``/``seed`` of the study in ``out``; returns its outcome
    (see the module docstring): {"status", "config_id", "seed", "host", "error": the failure's one
    line (failed, unreachable), "signum" (interrupted)}.

    ``deadline``: a time.monotonic() value (of this host) after which the run saves at its next batch
    boundary (it trains one batch first, unless ``skip_after_deadline`` and the time has passed before
    it began).
    ``device``: the device to train on instead of the plan's (the executor's placement). ``threads``:
    the run's thread count where ``--threads-per-run`` gave one (else a new run takes the process's,
    ``threads.default_threads()``, and a started one its own, from its checkpoint). ``token``:
    the value DIR/study.token must hold (Ray). ``lock_wait``: seconds to wait for a run lock held by
    a process that may be gone (a retried task). ``log``: where the Trainer's lines go.
    """
    outcome = {"config_id": config_id, "seed": int(seed), "host": socket.gethostname()}
    out = Path(out)
    try:
        if token is not None:
            check_token(out, token)
        plan = load_plan(out / STUDY_FILE)
        if plan is None:
            raise UsageError(f"{out} holds no {STUDY_FILE}")
        config = next((c for c in plan["configs"] if c["config_id"] == config_id), None)
        if config is None or int(seed) not in plan["seeds"]:
            raise UsageError(f"the study in {out} has no run {config_id} seed {seed}")
        run_dir = out / run_path(config_id, seed)
        if run_status(run_dir, plan["epochs"]) == "finished":
            return dict(outcome, status="finished")
        if stop_requested(out):
            return dict(outcome, status="interrupted")
        if skip_after_deadline and deadline is not None and time.monotonic() >= deadline:
            return dict(outcome, status="stopped")
        with run_lock(run_dir, lock_wait):
            status = run_status(run_dir, plan["epochs"])  # another process may have finished it meanwhile
            if status == "finished":
                return dict(outcome, status="finished")
            failure_path(run_dir).unlink(missing_ok=True)
            options = run_config(plan, config, int(seed))
            if device is not None:
                options["device"] = device
            if threads is not None:
                options["threads"] = threads
            _train(options, run_dir, out, status == "started", deadline, show_progress, log)
        return dict(outcome, status="finished")
    except StorageNotShared as exc:
        return dict(outcome, status="unreachable", error=one_line(exc))
    except TimeLimitReached:
        return dict(outcome, status="stopped")
    except Interrupted as exc:
        return dict(outcome, status="interrupted", signum=int(exc.signum))
    except KeyboardInterrupt:
        return dict(outcome, status="interrupted", signum=int(signal.SIGINT))
    except Exception as exc:  # noqa: BLE001  (any failure of one run is reported, and the others go on)
        error = one_line(exc)
        if not is_user_error(exc):  # a bug: its traceback goes to the run's log
            log("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip())
        if not isinstance(exc, LockHeld):  # (another process's run has not failed)
            _record_failure(out / run_path(config_id, seed), error)
        return dict(outcome, status="failed", error=error)


def _train(options, run_dir, out, resume, deadline, show_progress, log) -> None:
    """Build the study's Trainer for ``run_dir`` and train it."""
    with tc.backend.on_device(device_or_usage_error(options.get("device", "auto"))):
        trainer = study_trainer_class()(options, run_dir, resume=resume, show_progress=show_progress, log=log)
        trainer.deadline = deadline
        trainer.stop_file = Path(out) / STOP_FILE
        trainer.run()


def _record_failure(run_dir: Path, error: str) -> None:
    """Write RUN/failed.json for the summary and the driver (best effort: a full disk loses it)."""
    record = {"error": error, "host": socket.gethostname(), "pid": os.getpid(),
              "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomically(failure_path(run_dir), json.dumps(record) + "\n")
    except OSError:
        pass


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
