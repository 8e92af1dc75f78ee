"""Running programs under the CPU stand-in for CuPy (``tests/support/cupy_standin``), each in a process
of its own with the stand-in first on the path: for the stand-in tests of kernels/ and distributed/."""
import os
import re
import sys

from helpers import run_with_group_timeout, single_thread_env
from paths import ORACLES, ROOT, STANDIN, SUPPORT
from tinygrad_caps.distributed.launch import mpirun_command


def launch_standin(command, devices=2, processes=1, cwd=ROOT, timeout=300):
    """Run ``command`` (its Python programs see the stand-in as ``cupy``, with ``devices`` GPUs), under
    ``mpirun -n processes`` when processes > 1 (one BLAS thread per rank); returns the completed process."""
    env = single_thread_env() if processes > 1 else dict(os.environ)
    env.pop("TINYGRAD_CAPS_DEVICE", None)
    env.update(CUPY_STANDIN_DEVICES=str(devices), TINYGRAD_CAPS_REQUIRE_GPU="1",
               PYTHONPATH=os.pathsep.join([str(STANDIN), str(SUPPORT), str(ORACLES), os.environ.get("PYTHONPATH", "")]))
    # Measuring kernel variants on the emulation would only slow the stand-in runs (and choose by the
    # emulation's timings): off unless the caller turns it on; tuning_scenarios.py does, with its own cache.
    env.setdefault("TINYGRAD_CAPS_KERNEL_TUNING", "off")
    launcher = mpirun_command(processes) if processes > 1 else []
    return run_with_group_timeout(launcher + command, timeout, cwd=cwd, env=env)


def run_standin(args, **kwargs):
    """``python *args`` under the stand-in (see launch_standin); it must succeed; returns its stdout."""
    result = launch_standin([sys.executable, *args], **kwargs)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    return result.stdout


def summary(output: str) -> dict:
    """pytest's closing counts ("31 passed, 4 skipped") as {"passed": 31, "skipped": 4}."""
    last = output.strip().splitlines()[-1]
    return {word: int(count) for count, word in re.findall(r"(\d+) (\w+)", last)}
