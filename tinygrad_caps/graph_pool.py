"""Device memory private to one captured CUDA graph, as PyTorch's graph pools are: ``GraphPool``,
and ``step_peak_bytes``, the eager peak it is measured against.

While a step is captured, every allocation comes from a CuPy ``MemoryPool`` of the graph's own.
A buffer the step frees goes back to that pool, and a later allocation of the same capture may
reuse it: the graph replays its work in the order it was captured, on one stream, so the freed
buffer's last use comes before the new one's first, as it did in the eager step. The captured
step thus needs about what the eager step needed at its peak, instead of the sum of every
allocation it made. After the capture no one else allocates from the pool, so a buffer the graph
uses (freed or not) is never handed to another array while the graph lives; ``release`` gives
the pool's memory back to the device.

(CuPy's default pool, in contrast, would hand a buffer freed during the capture to the next array
that asks after it, while every replay still writes there: CuPy issue 9655.)
"""
from __future__ import annotations

import contextlib
import weakref

from . import backend

_retired = []  # released pools whose arrays were still alive: looked at again at each release


class GraphPool:
    """A CuPy memory pool for the allocations of one capture on ``device`` ("cuda" or "cuda:N").

    Released by ``release()``, or when the GraphPool is garbage-collected (a CapturedStep dropped
    without ``close``): a CuPy pool frees its memory when it goes, under any array it served that
    is still alive, so a pool whose arrays live on is kept (``_retired``) until they are gone."""

    def __init__(self, device: str):
        import cupy

        self.device = f"cuda:{backend.cuda_index(device)}"  # the GPU itself, whichever is current later
        self._pool = cupy.cuda.MemoryPool()
        self._finalizer = weakref.finalize(self, _give_back, self.device, self._pool)
        self._finalizer.atexit = False  # at exit the process's memory goes anyway

    @contextlib.contextmanager
    def allocating(self):
        """Within this context this thread allocates from the graph's pool (the allocator before
        comes back after it)."""
        import cupy

        with cupy.cuda.using_allocator(self._pool.malloc):
            yield self

    def reserved_bytes(self) -> int:
        """Bytes of device memory the pool holds for the graph (in use or free for its reuse); 0 once released."""
        if self._pool is None:
            return 0
        with backend.on_device(self.device):
            return int(self._pool.total_bytes())

    def used_bytes(self) -> int:
        """Bytes held by arrays made during the capture that are still alive (gradients, outputs)."""
        if self._pool is None:
            return 0
        with backend.on_device(self.device):
            return int(self._pool.used_bytes())

    def release(self) -> None:
        """Give the pool's free memory back to the device (after the graph is dropped and its work
        has run). Arrays made during the capture that are still alive (a parameter's gradient)
        keep their memory: the pool stays alive for them, and is dropped once they are gone, as a
        CuPy pool must outlive the arrays it served."""
        self._finalizer()  # once: a second call does nothing
        self._pool = None


def _give_back(device: str, pool) -> None:
    """Free what ``pool`` holds unused; keep it in ``_retired`` while arrays it served are alive."""
    with backend.on_device(device):
        pool.free_all_blocks()
        if pool.used_bytes():
            _retired.append((device, pool))
    _drop_retired()


def _drop_retired() -> None:
    """Drop the retired pools whose arrays are all gone, freeing what they held."""
    keep = []
    for device, pool in _retired:
        with backend.on_device(device):
            pool.free_all_blocks()
            if pool.used_bytes():
                keep.append((device, pool))
    _retired[:] = keep


def peak_bytes_hook():
    """A new CuPy memory hook (a context manager) that follows the bytes CuPy's pools hand out
    while it is active: ``live`` now and ``peak``, the most at any moment (in the sizes the pools
    round them to)."""
    import cupy

    class PeakBytesHook(cupy.cuda.MemoryHook):
        name = "PeakBytes"

        def __init__(self):
            self.live = self.peak = 0

        def malloc_postprocess(self, **info):
            self.live += info["mem_size"]
            self.peak = max(self.peak, self.live)

        def free_postprocess(self, **info):
            self.live -= info["mem_size"]

    return PeakBytesHook()


def step_peak_bytes(fn, device: str) -> int:
    """Run ``fn()`` once on ``device`` (a GPU); return the peak of device bytes its allocations
    held above what was held when it began: an eager step's peak, which a captured step's
    ``captured_bytes`` is compared with (``peak_bytes_hook``)."""
    import cupy

    hook = peak_bytes_hook()
    with backend.on_device(device), hook:
        fn()
        cupy.cuda.get_current_stream().synchronize()
    return hook.peak
