"""Opt-in tuning of the process's memory allocator for large temporaries: ``tc.tune_allocator()``.

Importing tinygrad_caps changes nothing process-wide; the CLI and the benchmarks call
``tune_allocator()`` (``TINYGRAD_CAPS_MALLOC_TUNING=0`` turns it off there too).

What it changes, for the whole process (PyTorch and anything else in it included):
- glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` go to 1 GiB through ``mallopt``. glibc
  serves blocks above the mmap threshold (128 KiB at first) with a fresh ``mmap`` and unmaps them
  on free, so every large intermediate array of every op pays page faults and zeroing again;
  with the raised thresholds freed blocks are reused. ``M_ARENA_MAX`` goes to 1, so the threads that
  split large NumPy loops (``_parallel.py``) allocate from the one heap whose freed blocks the
  next op reuses, instead of each keeping an arena of its own. Skipped when the user set
  ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` (their choice wins), and on non-glibc C
  libraries.
- NumPy's per-array ``madvise(MADV_HUGEPAGE)`` request for arrays of 4 MiB and more is turned
  off (unless ``NUMPY_MADVISE_HUGEPAGE`` is set). Where the kernel compacts memory on the spot
  (THP ``defrag`` = ``madvise``), each large allocation stalls, and a training step makes fresh
  routing gradients of tens of MB at every step.

What it gains on a training step is measured in benchmarks/RESULTS.md ("Allocator tuning").
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
THRESHOLD_BYTES = 1 << 30
GLIBC_DEFAULT_BYTES = 128 * 1024

applied = False                   # mallopt thresholds currently raised by us
hugepage_madvise_disabled = False  # NumPy's hugepage madvise currently turned off by us


def _mallopt():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def _set_thresholds(value: int, arenas: int) -> bool:
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return (bool(mallopt(M_MMAP_THRESHOLD, value)) and bool(mallopt(M_TRIM_THRESHOLD, value))
            and bool(mallopt(M_ARENA_MAX, arenas)))


def _numpy_hugepage_switch():
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # NumPy 1.x keeps it in numpy.core
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            return None
    return _set_madvise_hugepage


def tune_allocator(enabled: bool = True) -> dict:
    """Tune (or, with ``enabled=False``, restore) glibc malloc and NumPy's hugepage advice, process-wide.

    See this module's docstring for what changes and why. ``TINYGRAD_CAPS_MALLOC_TUNING=0`` makes
    ``tune_allocator(True)`` a no-op. Returns ``{"mallopt": bool, "numpy_hugepage_madvise_off": bool}``:
    the state in force afterwards.
    """
    global applied, hugepage_madvise_disabled
    if enabled:
        if os.environ.get("TINYGRAD_CAPS_MALLOC_TUNING", "1") != "0":
            if "MALLOC_MMAP_THRESHOLD_" not in os.environ and "MALLOC_TRIM_THRESHOLD_" not in os.environ:
                applied = _set_thresholds(THRESHOLD_BYTES, 1) or applied
            switch = _numpy_hugepage_switch()
            if switch is not None and "NUMPY_MADVISE_HUGEPAGE" not in os.environ:
                switch(False)
                hugepage_madvise_disabled = True
    else:
        if applied and _set_thresholds(GLIBC_DEFAULT_BYTES, 0):
            applied = False
        switch = _numpy_hugepage_switch()
        if hugepage_madvise_disabled and switch is not None:
            switch(True)
            hugepage_madvise_disabled = False
    return {"mallopt": applied, "numpy_hugepage_madvise_off": hugepage_madvise_disabled}
