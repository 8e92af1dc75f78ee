"""Split NumPy work that is independent along one axis across the machine's cores.

NumPy runs copies and elementwise loops on one core; it releases the GIL inside them, so a few
threads, each on its own slice of channels, run them side by side. Each slice writes only its
own part of the output, so the result is identical to the one-thread loop (no reductions across
slices). ``TINYGRAD_CAPS_NUM_THREADS`` sets the number of threads (default: the CPUs this process
may use; 1 turns it off).
"""
from __future__ import annotations

import math
import operator
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

MIN_BYTES_PER_THREAD = 1 << 20  # below this the thread hand-off costs more than it saves

_pool = None


def thread_count() -> int:
    """Threads for splittable NumPy work: ``$TINYGRAD_CAPS_NUM_THREADS``, else the usable CPUs."""
    forced = os.environ.get("TINYGRAD_CAPS_NUM_THREADS")
    if forced:
        return max(1, int(forced))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _executor(workers):
    global _pool
    if _pool is None or _pool._max_workers < workers:
        _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tinygrad-caps")
    return _pool


def over_slices(count: int, work, nbytes: int) -> None:
    """Call ``work(start, stop)`` on consecutive slices covering ``range(count)``, in parallel.

    ``nbytes`` is the size of the data the whole call touches; small calls run inline.
    """
    workers = min(thread_count(), count, max(1, nbytes // MIN_BYTES_PER_THREAD))
    if workers < 2:
        work(0, count)
        return
    bounds = [count * k // workers for k in range(workers + 1)]
    futures = [_executor(workers).submit(work, bounds[k], bounds[k + 1]) for k in range(1, workers)]
    work(bounds[0], bounds[1])  # this thread takes the first slice
    for future in futures:
        future.result()


PARALLEL_ELEMENTWISE_BYTES = 8 << 20  # outputs smaller than this are computed in one call
_OPERATORS = {np.add: operator.add, np.subtract: operator.sub, np.multiply: operator.mul, np.divide: operator.truediv}


def binary(ufunc, a, b):
    """``ufunc(a, b)`` with broadcasting; a large NumPy result is computed in slices of its first axis in parallel.

    Only same-dtype NumPy operands are split (the result dtype is then theirs); anything else is
    one plain call, so the values are always exactly those of ``ufunc(a, b)``.
    """
    plain = _OPERATORS.get(ufunc, ufunc)  # CuPy arrays and scalars go through their own operators
    if type(a) is not np.ndarray or type(b) is not np.ndarray or a.dtype != b.dtype:
        return plain(a, b)
    shape = np.broadcast_shapes(a.shape, b.shape)
    if len(shape) == 0 or shape[0] < 2 or math.prod(shape) * a.dtype.itemsize < PARALLEL_ELEMENTWISE_BYTES:
        return plain(a, b)
    out = np.empty(shape, dtype=a.dtype)
    a, b = np.broadcast_to(a, shape), np.broadcast_to(b, shape)

    def run(start, stop):
        ufunc(a[start:stop], b[start:stop], out=out[start:stop])

    over_slices(shape[0], run, out.nbytes)
    return out
