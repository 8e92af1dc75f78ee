"""The Ray executor (``study run --executor ray``): every run is a Ray task with the placement's CPUs
and GPUs; Ray places it on a node of the cluster, and the task trains the run folder with
``run_task.train_study_run`` (the same code as a local run), writing to the study folder directly:
no run data travels through Ray's object store, only the task's small ``RunResult``.

The cluster: ``--ray-address`` (or ``$RAY_ADDRESS``), else a local Ray started for the study and
stopped after it. An address that does not answer is a UsageError within ``CONNECT_SECONDS``, before
anything is created.

Shared storage: the study folder must be on storage every node sees. Before the plan is written,
the driver writes DIR/study.token and a probe task on every node checks it (``prepare``); each run's
task checks it again before training. A node that cannot see it is named in one line.

Faults: a task whose worker process or node dies is retried by Ray (``max_retries``) and continues
from the run's ``last.npz``; its predecessor's RUN/run.lock is taken over once stale (at once on the
same node, after ``lock.STALE_AFTER_SECONDS`` from another). A task that raised is not retried: a
run's own failure is reported as such.
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from urllib.parse import urlparse

from ...errors import UsageError
from ..training.run_state import write_text_atomically
from .folder import StudyFolder
from .lock import STALE_AFTER_SECONDS
from .outcome import Outcome, RunResult
from .run_task import check_token, train_study_run
from .study_progress import StudyProgress

CONNECT_SECONDS = 20.0
INSTALL_HINT = "pip install -e \".[cluster]\" (or pip install \"ray[default]\")"
TEST_HOOKS = ("TINYGRAD_CAPS_TEST_CRASH", "TINYGRAD_CAPS_TEST_CRASH_ONCE")  # passed on to the tasks


def import_ray():
    """The ``ray`` module; UsageError saying how to install it where it is missing."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--executor ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def check_address_answers(address: str, timeout: float = CONNECT_SECONDS) -> None:
    """UsageError unless something listens at ``address`` ("host:port" or "ray://host:port");
    "auto" and "local" are left to Ray."""
    if address in ("auto", "local"):
        return
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        raise UsageError(f"--ray-address {address}: expected HOST:PORT (the head node's GCS, 6379 by default) "
                         "or ray://HOST:PORT")
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise UsageError(f"--ray-address {address}: no Ray cluster answers there ({exc.strerror or exc}); start one "
                         "with `ray start --head` or check the address") from None


class RayExecutor:
    """Runs of one study as Ray tasks (see the module docstring)."""

    retries_runs = False  # Ray retries a task whose worker or node died; the driver reports what is left
    start_verb = "submitted to Ray"
    running_once_started = False  # a task may wait for its resources: running once it holds its run lock
    shares_signals = False  # the tasks run in Ray's workers: a Ctrl-C reaches the driver alone

    def __init__(self, folder, placement):
        self.folder, self.placement = StudyFolder(StudyFolder.of(folder).path.absolute()), placement
        self.ray = import_ray()
        self.started_local = False
        self.refs = {}  # ObjectRef -> PlannedRun
        self.token = uuid.uuid4().hex
        self._connect()
        self.task = self.ray.remote(ray_train_run)

    def _connect(self) -> None:
        address = self.placement.ray_address
        if address:
            check_address_answers(address)
        options = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            if address:
                self.ray.init(address=address, **options)
            else:
                from .placement import usable_cpus
                from tinygrad_caps.backend import gpu_available

                gpus = None if gpu_available() else 0
                self.ray.init(num_cpus=usable_cpus(), num_gpus=gpus, **options)
                self.started_local = True
        except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
            raise UsageError(f"--executor ray: cannot connect to Ray at {address or 'a new local Ray'}: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None

    def prepare(self) -> None:
        """Write DIR/study.token and check, with a probe task on every alive node, that each sees it;
        UsageError naming the nodes that do not (the token is removed again)."""
        token_path = self.folder.token
        write_text_atomically(token_path, self.token + "\n")
        probe = self.ray.remote(num_cpus=0)(probe_study_folder)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
                .remote(str(self.folder), self.token) for node in self.ray.nodes() if node.get("Alive")]
        problems = [problem for problem in self.ray.get(refs) if problem]
        if problems:
            token_path.unlink(missing_ok=True)
            raise UsageError(problems[0] + (f" (and {len(problems) - 1} more nodes)" if len(problems) > 1 else ""))

    def has_room(self) -> bool:
        """Always: every run is submitted at once, and Ray starts each where its resources are free."""
        return True

    def running(self) -> list:
        """The runs submitted whose tasks have not been collected by ``wait``."""
        return list(self.refs.values())

    def start(self, run, deadline=None, must_train=False) -> None:
        """Submit ``run``'s task (its deadline as a wall-clock time: the task may run on another node)."""
        env = self.placement.thread_environment()
        env.update({name: os.environ[name] for name in TEST_HOOKS if name in os.environ})
        wall_deadline = None if deadline is None else time.time() + (deadline - time.monotonic())
        ref = self.task.options(num_cpus=self.placement.cpus_per_run, num_gpus=self.placement.gpus_per_run,
                                max_retries=self.placement.max_retries, retry_exceptions=False,
                                runtime_env={"env_vars": env}).remote(
            str(self.folder), run.config_id, run.seed, self.token, wall_deadline, must_train,
            self.placement.threads if self.placement.threads_given else None)
        self.refs[ref] = run

    def wait(self, timeout: float) -> list:
        """The RunResults of the runs whose tasks ended within ``timeout`` seconds."""
        if not self.refs:
            return []
        ready, _ = self.ray.wait(list(self.refs), num_returns=len(self.refs), timeout=timeout)
        results = []
        for ref in ready:
            run = self.refs.pop(ref)
            try:
                result = self.ray.get(ref).with_run(run)
            except self.ray.exceptions.RayError as exc:  # the worker or node died more than max_retries times
                result = RunResult(run, Outcome.FAILED, f"its Ray task was lost after {self.placement.max_retries} "
                                                        f"retries: {type(exc).__name__}: {_first_line(exc)}")
            results.append(result)
        return results

    def kill_all(self) -> None:
        """Cancel every task at once (their runs continue from their last checkpoint on resume)."""
        for ref in list(self.refs):
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001  (a task that has just ended cannot be cancelled)
                pass
        self.refs.clear()

    def close(self) -> None:
        """Cancel what still runs and disconnect (stopping the local Ray this executor started); the
        token stays in DIR (a later ``--resume`` writes its own)."""
        self.kill_all()
        if self.ray.is_initialized():
            self.ray.shutdown()

    def progress(self, runs, folder, epochs: int, show: bool) -> StudyProgress:
        """The study's lines: each run's "submitted" line, its "started" line once its task holds its
        run lock, its "finished" or "failed" line, and the progress line."""
        return StudyProgress.of_runs(runs, folder, epochs, show, start_verb=self.start_verb,
                                     running_once_started=self.running_once_started)


def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def probe_study_folder(out: str, token: str):
    """(A Ray task, one per node.) None where this node sees DIR/study.token holding ``token``, else
    the one-line reason naming the node."""
    try:
        check_token(out, token)
    except UsageError as exc:
        return str(exc)
    return None


def ray_train_run(out: str, config_id: str, seed: int, token: str, wall_deadline, must_train: bool,
                  threads=None) -> RunResult:
    """(A Ray task.) Train one run of the study in ``out`` with ``train_study_run``, its lines going to
    RUN/train.log; returns its RunResult. A retried task waits for the run lock of its dead predecessor."""
    import contextlib
    import sys

    deadline = None if wall_deadline is None else time.monotonic() + (wall_deadline - time.time())
    log_path = StudyFolder(out).run(config_id, seed).train_log
    try:
        check_token(out, token)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "a", encoding="utf-8")
    except (UsageError, OSError):
        return train_study_run(out, config_id, seed, token=token)  # (its result names the problem)
    with log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        def say(text: str) -> None:
            print(text, flush=True)

        result = train_study_run(out, config_id, seed, deadline=deadline, token=token, log=say, threads=threads,
                                 skip_after_deadline=not must_train, lock_wait=STALE_AFTER_SECONDS + 30)
        if result.outcome is Outcome.FAILED:  # (the run's log says why it ended)
            say(f"failed: {result.reason}")
    sys.stdout.flush()
    return result
