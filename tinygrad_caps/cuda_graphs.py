"""Capture a step function (forward, backward, optimizer step) as a CUDA graph and replay it.

    step = tc.cuda_graphs.CapturedStep(train_step, inputs=[images, labels], warmup=2)
    for x, y in batches:
        step(x, y)   # copies x, y into the static inputs, then runs train_step: eagerly for the
                     # first ``warmup`` calls, captured at the next, replayed ever after

A replay launches, with one call, every kernel that ``train_step`` launched when it was captured,
on the same buffers and with the same scalar arguments. The graph replays what the engine's tape
recorded and the backward it derived: nothing about the step is written by hand.

What a captured function must respect (the engine's ops do; CuPy raises where they do not):
- it reads its inputs only from the static input tensors, whose arrays keep their place;
- nothing in it synchronizes with the host or copies from or to it (``.item()``, ``float()``,
  ``bool()`` of a GPU value, ``cupy.asarray`` of host data): values a later replay must see
  change, such as the learning rate, live on the device (``Adam(capturable=True)``);
- cuBLAS and cuRAND are not called through CuPy (the engine's products go through
  ``kernels.gemm``, which calls cuBLAS directly; dropout masks drawn by cuRAND cannot be captured);
- its shapes do not change between calls (a last, smaller batch runs eagerly instead).

Memory: the capture allocates from a pool private to the graph (``graph_pool.GraphPool``, as
PyTorch's graphs do), in which a buffer freed during the capture is reused by a later allocation
of the same capture: a captured step needs about the eager step's peak (``captured_bytes``), and
no buffer the graph uses is handed to another array while it lives; ``close()`` gives it back.
"""
from __future__ import annotations

import gc

import numpy as np

from . import backend
from .graph_pool import GraphPool
from .tensor import Tensor


MODES = ("auto", "on", "off")  # how a trainer may use capture: where it can, always (or fail), never


class CaptureError(RuntimeError):
    """The step could not be captured (an operation that a CUDA graph cannot hold); the message
    names the first one."""


def capturing(array) -> bool:
    """Whether ``array`` is a CuPy array and the current stream is capturing a graph: ops skip
    their host-side value checks then (they would read the GPU), as the captured values are
    checked where they enter (the data layer checks labels when it loads them)."""
    if type(array) is np.ndarray or not backend.is_cupy_array(array):
        return False
    import cupy

    return cupy.cuda.get_current_stream().is_capturing()


def capture_unavailable_reason(device) -> str | None:
    """Why a step on ``device`` ("cpu", "cuda", "cuda:N") cannot be captured, or None when it can."""
    try:
        device = backend.normalize_device(device)
    except Exception as exc:  # noqa: BLE001  (an unusable device is itself the reason)
        return str(exc)
    if not device.startswith("cuda"):
        return f"CUDA graphs need a GPU; this run is on {device}"
    import cupy

    if getattr(getattr(cupy.cuda, "runtime", None), "is_hip", False):
        return "CUDA graphs are not available on ROCm/HIP"
    return None


class CapturedStep:
    """``fn()`` captured as a CUDA graph after ``warmup`` eager calls, then replayed (see the module docstring).

    Args:
        fn: a function of no arguments that reads the static ``inputs`` and does one step; what it
            returns is returned by every eager call (a replay returns None: read results from
            buffers that persist, such as accumulators and parameters).
        inputs: Tensors on one GPU; each call copies its arguments into them (same shapes and dtypes).
        warmup: eager calls before the capture (they compile kernels, create the cuBLAS handle
            and the optimizer's state, and grow the memory pool to the step's size).
    """

    def __init__(self, fn, inputs, warmup: int = 2):
        import cupy

        self.fn, self.inputs, self.warmup = fn, list(inputs), int(warmup)
        if not self.inputs or not all(isinstance(t, Tensor) and t.device.startswith("cuda") for t in self.inputs):
            raise ValueError("CapturedStep: inputs must be Tensors on a GPU")
        if len({t.device for t in self.inputs}) != 1:
            raise ValueError(f"CapturedStep: inputs must share one GPU, got {sorted({t.device for t in self.inputs})}")
        if self.warmup < 1:
            raise ValueError(f"CapturedStep: warmup must be at least 1 (kernels compile there), got {warmup}")
        self.device = self.inputs[0].device
        with backend.on_device(self.device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.graph, self.calls, self._pool = None, 0, None

    @property
    def captured(self) -> bool:
        """Whether the graph exists (calls now replay it)."""
        return self.graph is not None

    @property
    def captured_bytes(self) -> int:
        """Bytes of device memory the graph's private pool holds (0 before the capture and after
        ``close``): what the captured step needs beyond the buffers that existed before it (the
        parameters, the optimizer's state, the static inputs)."""
        return 0 if self._pool is None else self._pool.reserved_bytes()

    def __call__(self, *arrays):
        """Copy ``arrays`` (NumPy or CuPy) into the static inputs and run the step; see the class docstring.

        The step runs on a stream of its own (a capture needs one), ordered with the caller's
        current stream both ways: it sees everything issued there before the call (the input
        copies, a changed learning rate), and work issued there after the call sees its results.
        """
        import cupy

        if len(arrays) != len(self.inputs):
            raise ValueError(f"CapturedStep: {len(self.inputs)} inputs, got {len(arrays)} arrays")
        with backend.on_device(self.device):
            caller = cupy.cuda.get_current_stream()
            for k, (target, source) in enumerate(zip(self.inputs, arrays)):
                if tuple(source.shape) != target.shape or np.dtype(source.dtype) != np.dtype(target.dtype):
                    raise ValueError(f"CapturedStep: input {k} must be {target.dtype} {target.shape} (the captured "
                                     f"shape), got {source.dtype} {tuple(source.shape)}")
                if type(source) is np.ndarray:
                    target.data.set(np.ascontiguousarray(source))
                else:
                    cupy.copyto(target.data, source)
            self.stream.wait_event(caller.record())
            try:
                with self.stream:
                    return self._run()
            finally:
                caller.wait_event(self.stream.record())

    def _run(self):
        if self.graph is not None:
            self.graph.launch(self.stream)
            return None
        self.calls += 1
        if self.calls <= self.warmup:
            return self.fn()
        self._capture()
        self.graph.launch(self.stream)  # a capture records the work without running it
        return None

    def _capture(self):
        import cupy

        self.stream.synchronize()
        # What the warm-up steps freed sits cached in CuPy's default pool, where the graph's pool
        # cannot take it: give it back to the device first (as PyTorch empties its cache before a capture).
        gc.collect()
        cupy.get_default_memory_pool().free_all_blocks()
        pool = GraphPool(self.device)
        try:
            with pool.allocating():
                self.stream.begin_capture()
                try:
                    self.fn()
                except Exception as exc:
                    try:
                        self.stream.end_capture()
                    except Exception:  # noqa: BLE001  (the capture was invalidated; its first cause is reported)
                        pass
                    raise CaptureError(f"the step cannot be captured as a CUDA graph: {type(exc).__name__}: "
                                       f"{exc}") from exc
                graph = self.stream.end_capture()
        except BaseException:
            pool.release()
            raise
        graph.upload(self.stream)
        self.graph, self._pool = graph, pool

    def synchronize(self) -> None:
        """Wait until every step issued so far has run."""
        self.stream.synchronize()

    def __del__(self):
        # A CapturedStep dropped without close(): its graph goes before the buffers it replays on
        # (the static inputs, what fn holds), which the attributes' own order would free first.
        self.graph = None

    def close(self) -> None:
        """Wait for the steps issued, drop the graph and give its pool's memory back to the device
        (what arrays made during the capture still hold, such as the gradients, when they go)."""
        self.synchronize()
        self.graph = None
        if self._pool is not None:
            self._pool.release()
            self._pool = None
