"""Shared test settings: Hypothesis profiles and the GPU marker (``gpu`` tests skip without a GPU,
and fail instead under ``TINYGRAD_CAPS_REQUIRE_GPU=1``).

Profiles: "default" keeps the suite to a few minutes on 2 cores; ``HYPOTHESIS_PROFILE=long`` runs
many more examples per property for a deeper local check.

The tests are grouped by layer (engine/, kernels/, models/, data/, distributed/, app/); what they
share lives in support/ (helpers, dataset writers, the CuPy stand-in, scripts run in processes of
their own) and oracles/ (independent reference implementations and PyTorch's stored answers). Both
folders go on the import path here, so a test file says ``from helpers import ...`` or
``from torch_reference import ...`` from any folder. No folder has an ``__init__.py``: pytest imports
each test file by its basename, so basenames stay unique across folders (pytest refuses a duplicate).
"""
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

TESTS = Path(__file__).resolve().parent
for folder in ("oracles", "support"):  # support/ ends up first
    if str(TESTS / folder) not in sys.path:
        sys.path.insert(0, str(TESTS / folder))

settings.register_profile("default", max_examples=12, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# The mutation run (tests/mutation/run_mutation.py): the default examples, reproducible, no shrinking.
settings.register_profile("mutation", max_examples=12, deadline=None, derandomize=True, database=None,
                          phases=[Phase.explicit, Phase.generate],
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
os.environ["TINYGRAD_CAPS_OFFLINE"] = "1"  # tests never touch the network (subprocesses inherit this)
# Tensors made without a device default to "cuda" where a GPU is usable, while nn layers start on
# the CPU: the suite's device-less tests are CPU tests, and the GPU tests name their device.
os.environ.setdefault("TINYGRAD_CAPS_DEVICE", "cpu")
# The CLI tests call main() in this process; main() tunes malloc for the whole process (1 GiB trim
# threshold), which would keep every freed test allocation resident. Tests need no tuning.
os.environ.setdefault("TINYGRAD_CAPS_MALLOC_TUNING", "0")


THREAD_VARIABLES = ("TINYGRAD_CAPS_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def keep_bytecode() -> None:
    """Where ``PYTHONDONTWRITEBYTECODE`` is set (many container images set it), every process the
    suite starts would compile the package from source again, and every worker would rewrite every
    test module's asserts again: about a second per collection of the suite and a fifth of a second
    per Python process started (hundreds). The suite lets Python keep bytecode, for this process
    and, through the environment, the workers and every process they start, where Python keeps it:
    in ``__pycache__`` beside each source (git ignores the tree's), so the bytecode pip wrote for
    the installed packages is used as well. (A ``PYTHONPYCACHEPREFIX`` would keep the tree clean but
    makes Python ignore that bytecode: the first processes of a fresh environment compiled NumPy,
    matplotlib and Ray again into it, about 5 CPU-seconds each.) A prefix the user set is used;
    ``TINYGRAD_CAPS_BYTECODE=off`` (the mutation runs: a planted bug and its original can share a
    size and an mtime second) keeps the setting as it is."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("TINYGRAD_CAPS_BYTECODE") == "off":
        return
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    sys.dont_write_bytecode = False


def pytest_configure(config):
    """Before any test module is imported (and, under ``pytest -n N``, before the workers start):
    bytecode kept (``keep_bytecode``); under pytest-xdist each worker, and what it
    starts, computes on its share of the cores (the engine's threads and BLAS's), so that N workers
    never run more threads than there are cores; a value already set is kept."""
    keep_bytecode()
    workers = getattr(config.option, "numprocesses", None)
    if workers and not hasattr(config, "workerinput"):
        share = str(max(1, usable_cores() // int(workers)))
        for name in THREAD_VARIABLES:
            os.environ.setdefault(name, share)


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # (without pytest-xdist, or -p no:xdist, no such hook)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the cores. A sixth of a worker's time is spent waiting for
    processes it started (a study's runs, Ray, ``mpirun``, the stand-in's programs); the extra worker
    computes meanwhile. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides where it is set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return usable_cores() + 1


def mark_slow(items) -> None:
    """Add the ``slow`` marker to the items of ``SLOW_FILES`` and ``SLOW_TESTS`` (support/slow_tests.py)."""
    from slow_tests import SLOW_FILES, SLOW_TESTS

    for item in items:
        path = Path(str(item.fspath)).resolve().relative_to(TESTS).as_posix()
        if path in SLOW_FILES or f"{path}::{item.originalname}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


def slow_first(items) -> None:
    """Under pytest-xdist, put the slow tests first (in their order): the workers share the long ones
    at the start, and the run ends on short tests instead of one worker finishing a long one alone.
    Every worker collects, and sorts, the same way."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_modifyitems(config, items):
    from tinygrad_caps.backend import gpu_available

    mark_slow(items)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow_first(items)

    if gpu_available():
        return
    if os.environ.get("TINYGRAD_CAPS_REQUIRE_GPU") == "1":
        # benchmarks/gpu_check.sh: a GPU test that cannot run is a failure, never a skip
        def fail_without_gpu():
            pytest.fail("TINYGRAD_CAPS_REQUIRE_GPU=1 but no usable GPU: " + gpu_status_message())

        for item in items:
            if item.get_closest_marker("gpu"):
                item.runtest = fail_without_gpu
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy; none is usable here")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def gpu_status_message() -> str:
    from tinygrad_caps.backend import _gpu_status

    return _gpu_status()[1]
