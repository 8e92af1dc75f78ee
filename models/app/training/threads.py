"""The thread count a training run computes with: the engine's threads (``TINYGRAD_CAPS_NUM_THREADS``)
and the BLAS library's, set together for the length of a run (``run_threads``).

The engine's threads never split a sum, but BLAS splits a matrix product's sums across its threads,
so float32 results depend on its thread count in their last bits. A run records its count
(``TrainingConfig.threads``, config.json's ``threads``) and ``--resume`` restores it, so that a
stopped and continued run computes what a run never stopped does.

The BLAS threads are set at run time through the library NumPy loaded: OpenBLAS (NumPy's wheels
bundle it as scipy-openblas) or MKL, found among the process's loaded libraries. Where neither is
found (another BLAS, or a system without /proc), only the engine's threads are set; the BLAS keeps
what ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS`` gave it when it loaded (``blas_settable`` says
which).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass

ENGINE_VARIABLE = "TINYGRAD_CAPS_NUM_THREADS"
MAX_THREADS = 4096  # --threads at most: far above any machine's cores
# (get, set) function pairs of the BLAS libraries whose threads can be set at run time
BLAS_FUNCTIONS = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                  ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
                  ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
                  ("openblas_get_num_threads", "openblas_set_num_threads"),
                  ("MKL_Get_Max_Threads", "MKL_Set_Num_Threads"))
BLAS_NAMES = ("openblas", "mkl_rt")  # in the file names of the libraries searched


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """The thread count of a run that names none: ``$TINYGRAD_CAPS_NUM_THREADS`` (what the engine
    takes), else the BLAS library's own (what ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS`` gave it,
    else its default, the CPUs), else the usable CPUs."""
    forced = os.environ.get(ENGINE_VARIABLE, "").strip()
    if forced:
        try:
            return max(1, int(forced))
        except ValueError:
            pass
    return blas_threads() or usable_cpus()


@dataclass(frozen=True)
class _Blas:
    """The loaded BLAS library's thread functions."""

    get: object
    set: object


_blas_cache = []


def _loaded_blas():
    """The thread functions of the BLAS library this process has loaded (NumPy's), or None."""
    if _blas_cache:
        return _blas_cache[0]
    import numpy  # noqa: F401  (NumPy loads its BLAS; it is searched for among the loaded libraries)

    found = None
    for path in _loaded_libraries():
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in BLAS_FUNCTIONS:
            if hasattr(library, get_name) and hasattr(library, set_name):
                getter, setter = getattr(library, get_name), getattr(library, set_name)
                getter.restype, setter.restype = ctypes.c_int, None
                setter.argtypes = [ctypes.c_int]
                found = _Blas(getter, setter)
                break
        if found is not None:
            break
    _blas_cache.append(found)
    return found


def _loaded_libraries() -> list:
    """The files of the loaded shared libraries whose names say BLAS (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            fields = [line.split(maxsplit=5) for line in maps]
    except OSError:
        return []
    paths = {parts[5].strip() for parts in fields if len(parts) == 6}  # (a mapping without a file has 5)
    return sorted(path for path in paths if any(name in os.path.basename(path).lower() for name in BLAS_NAMES))


def blas_settable() -> bool:
    """Whether the BLAS library's threads can be set at run time here (OpenBLAS or MKL found)."""
    return _loaded_blas() is not None


def blas_threads():
    """The BLAS library's thread count now, or None where it cannot be read."""
    blas = _loaded_blas()
    return None if blas is None else int(blas.get())


@contextlib.contextmanager
def run_threads(threads: int):
    """``with run_threads(n)``: the engine and the BLAS library compute with ``n`` threads inside the
    block, and with what they had before after it."""
    previous_engine = os.environ.get(ENGINE_VARIABLE)
    previous_blas = blas_threads()
    os.environ[ENGINE_VARIABLE] = str(int(threads))
    if previous_blas is not None:
        _loaded_blas().set(int(threads))
    try:
        yield
    finally:
        if previous_engine is None:
            os.environ.pop(ENGINE_VARIABLE, None)
        else:
            os.environ[ENGINE_VARIABLE] = previous_engine
        if previous_blas is not None:
            _loaded_blas().set(previous_blas)
