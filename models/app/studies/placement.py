"""Where a study's runs train: the scheduling options of ``study run``, checked before anything is
created, and the slots they give.

Local executor (``--executor local``, the default):
    ``--jobs N`` runs at a time, each in its own process (``--jobs 1`` without ``--threads-per-run``
    or ``--devices`` trains in the driver's process, as studies always did). ``--threads-per-run T``:
    each run's engine and BLAS threads (default: the usable CPUs divided by the runs at a time, at
    least 1). On GPUs, ``--devices cuda:0,cuda:1`` (default with ``--device cuda``/``auto``: every
    visible GPU) and ``--runs-per-device K`` (default 1) give len(devices) x K slots; ``--jobs``
    (default: every slot) caps the runs at a time.
Ray executor (``--executor ray``):
    every run is a Ray task with ``--cpus-per-run C`` (default: T, else 1) and ``--gpus-per-run G``
    (default: 1 where the study trains on a GPU, else 0; fractions share a GPU) and ``--max-retries R``
    retries of a task whose worker or node dies; Ray places them (``--jobs``, ``--devices`` and
    ``--runs-per-device`` are the local executor's and are refused with it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import tinygrad_caps as tc

from ...errors import UsageError

EXECUTORS = ("local", "ray")
THREAD_VARIABLES = ("TINYGRAD_CAPS_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
MAX_RUNS_AT_ONCE = 4096  # --jobs, and --runs-per-device (each GPU's slots): far above any machine's
SCHEDULING_OPTIONS = ("executor", "jobs", "threads_per_run", "devices", "runs_per_device", "ray_address",
                      "cpus_per_run", "gpus_per_run", "max_retries")


@dataclass(frozen=True)
class Placement:
    """How the runs of one ``study run`` call are placed (see the module docstring)."""

    executor: str = "local"
    jobs: int = 1                  # runs at a time (local executor)
    threads: int = 1               # engine and BLAS threads of each run
    threads_given: bool = False    # --threads-per-run was given: a started run continues with it, not its own
    devices: tuple = ()            # local GPU slots: one device name per slot ("cuda:0", "cuda:0", "cuda:1", ...)
    in_process: bool = True        # train in the driver's process (local, one at a time, nothing placed)
    cpus_per_run: float = 1.0      # Ray
    gpus_per_run: float = 0.0      # Ray
    max_retries: int = 3           # retries of a run whose process, worker or node died
    ray_address: str | None = None

    def thread_environment(self) -> dict:
        """The environment variables that give a run ``threads`` engine, OpenMP and BLAS threads."""
        return {name: str(self.threads) for name in THREAD_VARIABLES}


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def study_placement(options: dict, device) -> Placement:
    """The Placement of ``options`` (the parsed scheduling options, SCHEDULING_OPTIONS, None where not
    given) for a study whose runs train on ``device`` (the plan's --device); a UsageError in one line
    for a value out of range, an unknown executor, a missing GPU, or an option of the other executor."""
    executor = options.get("executor") or "local"
    if executor not in EXECUTORS:
        raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    jobs, threads = options.get("jobs"), options.get("threads_per_run")
    runs_per_device, max_retries = options.get("runs_per_device"), options.get("max_retries")
    _at_least("--jobs", jobs, 1)
    _at_least("--threads-per-run", threads, 1)
    _at_least("--runs-per-device", runs_per_device, 1)
    _at_least("--max-retries", max_retries, 0)
    _at_most("--jobs", jobs, MAX_RUNS_AT_ONCE)
    _at_most("--runs-per-device", runs_per_device, MAX_RUNS_AT_ONCE)
    max_retries = 3 if max_retries is None else max_retries
    cpus, gpus = options.get("cpus_per_run"), options.get("gpus_per_run")
    if cpus is not None and not cpus > 0:
        raise UsageError(f"--cpus-per-run must be positive, got {cpus:g}")
    if gpus is not None and not gpus >= 0:
        raise UsageError(f"--gpus-per-run must be 0 or more, got {gpus:g}")
    if executor == "ray":
        local_only = [flag for flag, key in (("--jobs", "jobs"), ("--devices", "devices"),
                                             ("--runs-per-device", "runs_per_device")) if options.get(key) is not None]
        if local_only:
            raise UsageError(f"{', '.join(local_only)}: the local executor's; with --executor ray, Ray places the "
                             "runs: give --cpus-per-run and --gpus-per-run")
        on_gpu = _device_name(device) != "cpu"
        cpus = float(cpus if cpus is not None else (threads or 1))
        gpus = float(gpus if gpus is not None else (1.0 if on_gpu else 0.0))
        if gpus > 0 and not on_gpu:
            raise UsageError(f"--gpus-per-run {gpus:g}: this study trains on the CPU (--device {device})")
        return Placement(executor="ray", threads=threads or max(1, int(cpus)), threads_given=threads is not None,
                         in_process=False, cpus_per_run=cpus,
                         gpus_per_run=gpus, max_retries=max_retries,
                         ray_address=options.get("ray_address") or os.environ.get("RAY_ADDRESS") or None)
    ray_only = [flag for flag, key in (("--ray-address", "ray_address"), ("--cpus-per-run", "cpus_per_run"),
                                       ("--gpus-per-run", "gpus_per_run")) if options.get(key) is not None]
    if ray_only:
        raise UsageError(f"{', '.join(ray_only)}: options of --executor ray")
    slots = _gpu_slots(options.get("devices"), runs_per_device or 1, device)
    if slots:
        jobs = min(jobs or len(slots), len(slots))
    elif options.get("runs_per_device") is not None:
        raise UsageError(f"--runs-per-device: this study trains on the CPU (--device {device}); use --jobs")
    jobs = jobs or 1
    in_process = jobs == 1 and threads is None and options.get("devices") is None and not slots
    return Placement(executor="local", jobs=jobs, threads=threads or max(1, usable_cpus() // jobs),
                     threads_given=threads is not None, devices=slots, in_process=in_process, max_retries=max_retries)


def _at_least(flag: str, value, least: int) -> None:
    if value is not None and value < least:
        raise UsageError(f"{flag} must be at least {least}, got {value}")


def _at_most(flag: str, value, most: int) -> None:
    if value is not None and value > most:
        raise UsageError(f"{flag} must be at most {most}, got {value}")


def _device_name(device) -> str:
    """The canonical device ("cpu", "cuda", "cuda:N") of ``device``; UsageError where it is not here."""
    try:
        return tc.backend.normalize_device(device)
    except tc.DeviceError as exc:
        raise UsageError(str(exc)) from None


def _gpu_slots(devices, runs_per_device: int, device) -> tuple:
    """One device name per local slot: every listed (or, by default, every visible) GPU ``runs_per_device``
    times; () for a study on the CPU."""
    if devices is not None:
        names = [name.strip() for name in devices.split(",") if name.strip()]
        if not names:
            raise UsageError(f"--devices: expected GPUs separated by commas (cuda:0,cuda:1), got {devices!r}")
        if str(device).lower() == "cpu":
            raise UsageError("--devices places runs on GPUs; this study trains on the CPU (--device cpu)")
        gpus = []
        for name in names:
            if not name.lower().startswith(("cuda", "gpu")):
                raise UsageError(f"--devices: {name!r} is not a GPU (expected cuda:N)")
            try:
                gpus.append(tc.backend.absolute_device(name))
            except tc.DeviceError as exc:
                raise UsageError(f"--devices: {exc}") from None
        if len(set(gpus)) != len(gpus):
            raise UsageError(f"--devices names a GPU twice: {devices}; use --runs-per-device for several runs "
                             "on one GPU")
    else:
        name = _device_name(device)
        if name == "cpu":
            return ()
        if str(device).lower() in ("auto", "cuda", "gpu", "none"):  # every visible GPU
            count = tc.backend.cupy_module().cuda.runtime.getDeviceCount()
            gpus = [f"cuda:{index}" for index in range(count)]
        else:
            gpus = [tc.backend.absolute_device(name)]
    return tuple(gpu for gpu in gpus for _ in range(runs_per_device))
