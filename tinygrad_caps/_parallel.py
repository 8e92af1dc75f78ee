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


def matmul_by_slices(a, b, out, nbytes: int) -> None:
    """``np.matmul(a, b, out=out)`` for stacks of matrices, the stack (axis 0) split over the cores.

    For many small products (one per capsule or per example) that are each too small for BLAS's
    own threads; ``a``, ``b`` and ``out`` may be strided views, which BLAS reads and writes in place.
    """
    def run(start, stop):
        np.matmul(a[start:stop], b[start:stop], out=out[start:stop])

    over_slices(out.shape[0], run, nbytes)


PARALLEL_ELEMENTWISE_BYTES = 8 << 20  # outputs smaller than this are computed in one call
_OPERATORS = {np.add: operator.add, np.subtract: operator.sub, np.multiply: operator.mul, np.divide: operator.truediv}


def memory_order(array) -> tuple:
    """The axes of ``array`` from the largest stride to the smallest: ``array.transpose(order)``
    walks its memory front to back (identity for a C-contiguous array; (1, 2, 3, 0) for an NCHW view
    of a channels-first, batch-last buffer such as a convolution's output)."""
    return tuple(sorted(range(array.ndim), key=lambda axis: -abs(array.strides[axis])))


def binary(ufunc, a, b):
    """``ufunc(a, b)`` with broadcasting; a large NumPy result is computed in slices in parallel.

    Only NumPy operands are split; each slice runs the same ufunc loop with the dtypes NumPy
    resolves for the whole call, so the values are always exactly those of ``ufunc(a, b)``. The result keeps
    the memory layout of a full-shape operand, as NumPy's own ufuncs do: a transposed view in
    gives a transposed view out, and the slices are cut along the axis outermost in memory.
    """
    plain = _OPERATORS.get(ufunc, ufunc)  # CuPy arrays and scalars go through their own operators
    if type(a) is not np.ndarray or type(b) is not np.ndarray:
        return plain(a, b)
    if a.dtype != b.dtype and 0 in (a.ndim, b.ndim):
        return plain(a, b)  # NumPy 1.x promotes a 0-d operand by its value; leave that to NumPy
    # Small results at once, without working out their shape and dtype: at most a.size * b.size
    # values (a.size when the shapes match) of at most 16 bytes each.
    most_values = a.size if a.shape == b.shape else a.size * b.size
    if most_values * 16 < PARALLEL_ELEMENTWISE_BYTES:
        return plain(a, b)
    shape = np.broadcast_shapes(a.shape, b.shape)
    dtype = ufunc.resolve_dtypes((a.dtype, b.dtype, None))[2]  # what ufunc(a, b) would return
    if len(shape) == 0 or math.prod(shape) * dtype.itemsize < PARALLEL_ELEMENTWISE_BYTES:
        return plain(a, b)
    # The layout to keep: a full-shape operand's, unless it is itself a broadcast (a zero stride).
    full = [x for x in (a, b) if x.shape == shape and 0 not in x.strides]
    order = memory_order(full[0]) if full else tuple(range(len(shape)))
    a, b = np.broadcast_to(a, shape).transpose(order), np.broadcast_to(b, shape).transpose(order)
    out = np.empty(a.shape, dtype=dtype)
    if out.shape[0] < 2:
        ufunc(a, b, out=out)
    else:
        def run(start, stop):
            ufunc(a[start:stop], b[start:stop], out=out[start:stop])

        over_slices(out.shape[0], run, out.nbytes)
    return out if order == tuple(range(out.ndim)) else out.transpose(np.argsort(order))


def add_into(target, value):
    """``target += value`` (``value`` broadcasts to ``target``); returns the sum, which is ``target``
    itself for an array (a NumPy scalar cannot be updated in place). A large NumPy target is split
    along the axis outermost in its memory and summed in parallel (same values as one call)."""
    if type(target) is not np.ndarray or type(value) is not np.ndarray or target.ndim == 0 or \
            target.nbytes < PARALLEL_ELEMENTWISE_BYTES or np.may_share_memory(target, value):
        target += value  # (overlapping operands: NumPy's own call buffers them; slices would race)
        return target
    order = memory_order(target)
    out = target.transpose(order)
    value = np.broadcast_to(value, target.shape).transpose(order)

    def run(start, stop):
        np.add(out[start:stop], value[start:stop], out=out[start:stop])

    over_slices(out.shape[0], run, out.nbytes)
    return target

