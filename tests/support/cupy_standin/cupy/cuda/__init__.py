"""``cupy.cuda`` of the CPU stand-in: devices, streams (with capture into graphs), events, memory
hooks, allocators and pools (``_pool.py``), RawModule (compiled through a model of CuPy's kernel
cache, ``compiler.py``), and cuBLAS's matrix product for ``tinygrad_caps.kernels.gemm``."""
from __future__ import annotations

import contextlib
import re
import threading
import time
import weakref

import numpy

from .. import DEVICE_COUNT, _capture, _current_device, _local, _owners, _pool_lock, ndarray
from . import compiler, nvrtc, runtime  # noqa: F401
from ._pool import MemoryPool


def is_available() -> bool:
    return DEVICE_COUNT > 0


class Device:
    """A stand-in GPU. ``with Device(n):`` makes it current for this thread and restores the one
    before; ``use()`` makes it current."""

    def __init__(self, device=None):
        self.id = _current_device() if device is None else int(device)
        if not 0 <= self.id < DEVICE_COUNT:
            raise runtime.CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {self.id}")
        self._previous = []

    compute_capability = property(lambda self: "90")

    def use(self):
        _local.device = self.id

    def synchronize(self):
        for stream in list(_streams.values()):
            if stream.device_id == self.id:
                stream.synchronize()
        _refuse_sync_in_capture()

    def __enter__(self):
        self._previous.append(_current_device())
        _local.device = self.id
        return self

    def __exit__(self, *exc):
        _local.device = self._previous.pop()

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


class Stream:
    """A stream. Compute runs at once whatever the stream; NCCL collectives and graph launches
    enqueued on a stream other than the null stream are deferred until something waits for them: the stream's
    ``synchronize``, an event recorded after them (its ``synchronize``, or another stream's
    ``wait_event``), the device's ``synchronize``. So a collective runs as late as a GPU may run
    it, and code that reads its result without waiting reads the old values, as a race on a GPU
    would let it."""

    null = None

    def __init__(self, null=False, non_blocking=False, ptr=None):
        self.ptr = 0 if null else id(self)
        self.device_id = _current_device()
        self._previous = []
        self._capture = None  # a _Capture while this stream captures
        self._pending = []   # deferred work, in order
        self._enqueued = 0   # work ever enqueued (an event records this count)
        self._finished = 0
        if not null:
            _streams[self.ptr] = self

    def _enqueue(self, work):
        """Run ``work`` at once on the null stream, else when this stream is waited for."""
        if self.ptr == 0:
            work()
            return
        self._pending.append(work)
        self._enqueued += 1

    def _run_until(self, count):
        while self._finished < count:
            work = self._pending.pop(0)
            self._finished += 1
            work()

    def use(self):
        _local.stream = self
        return self

    def synchronize(self):
        if self._capture is not None:
            self._capture.invalidate("the stream was synchronized")
            raise runtime.CUDARuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted when stream "
                                           "is capturing")
        self._run_until(self._enqueued)

    def begin_capture(self, mode=None):
        """Record the work issued while this stream is current into a graph (``end_capture``)."""
        if self.ptr == 0:
            raise runtime.CUDARuntimeError("cudaErrorStreamCaptureUnsupported: the legacy null stream cannot capture")
        if self._capture is not None:
            raise runtime.CUDARuntimeError("cudaErrorIllegalState: the stream is capturing already")
        self._capture = _Capture(self.device_id)

    def is_capturing(self) -> bool:
        return self._capture is not None

    def end_capture(self):
        """The graph of what was recorded since ``begin_capture`` (CUDARuntimeError if the capture was invalidated)."""
        capture, self._capture = self._capture, None
        if capture is None:
            raise runtime.CUDARuntimeError("cudaErrorIllegalState: the stream is not capturing")
        capture.undo()
        if capture.invalid is not None:
            raise runtime.CUDARuntimeError(f"cudaErrorStreamCaptureInvalidated: {capture.invalid}")
        return Graph(capture.nodes, self.device_id, capture.watch)

    def wait_event(self, event):
        if not isinstance(event, Event):
            raise TypeError(f"wait_event takes a cupy.cuda.Event, got {type(event)}")
        event._complete()

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def __enter__(self):
        self._previous.append(get_current_stream())
        _local.stream = self
        return self

    def __exit__(self, *exc):
        _local.stream = self._previous.pop()


_streams = weakref.WeakValueDictionary()  # ptr -> Stream, every stream but the null stream
Stream.null = Stream(null=True)


def get_current_stream(device_id=None):
    return getattr(_local, "stream", None) or Stream.null


def stream_of(ptr: int) -> Stream:
    """The live Stream whose ``ptr`` this is (0: the null stream)."""
    if ptr == 0:
        return Stream.null
    try:
        return _streams[ptr]
    except KeyError:
        raise runtime.CUDARuntimeError(f"cudaErrorInvalidResourceHandle: no live stream has handle {ptr:#x}") from None


class Event:
    """An event timed by the host clock; completing it runs the deferred work recorded before it."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.disable_timing = disable_timing
        self._time = None
        self._stream, self._count = None, 0

    def record(self, stream=None):
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(f"record takes a cupy.cuda.Stream, got {type(stream)}")
        stream = stream or get_current_stream()
        self._stream, self._count = stream, stream._enqueued
        self._time = time.perf_counter()

    def _complete(self):
        if self._stream is not None:
            self._stream._run_until(self._count)

    def synchronize(self):
        if self._stream is not None and self._stream._capture is not None:
            self._stream._capture.invalidate("an event of the capturing stream was synchronized")
            raise runtime.CUDARuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted when stream "
                                           "is capturing")
        self._complete()

    @property
    def done(self):
        self._complete()
        return True


def get_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two recorded events (CUDA refuses events without timing, as here)."""
    if start.disable_timing or end.disable_timing or start._time is None or end._time is None:
        raise runtime.CUDARuntimeError("cudaErrorInvalidResourceHandle: an event without timing or never recorded")
    return (end._time - start._time) * 1e3


class MemoryPointer:
    """A pointer into device memory; one returned by an allocator holds its array's memory alive."""

    def __init__(self, ptr, device_id):
        self.ptr, self.device_id = ptr, device_id
        self._held = None

    def _hold(self, array):
        self._held, self.ptr = array, array.ctypes.data


# ----- stream capture -----
class GraphReplayError(runtime.CUDARuntimeError):
    """A graph launch found a buffer it recorded freed: on a GPU the pool would have handed that
    memory to another array, and the launch would read or overwrite it."""


def _refuse_sync_in_capture():
    capture = _capture()
    if capture is not None:
        capture.invalidate("the device was synchronized")
        raise runtime.CUDARuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted when stream is "
                                       "capturing")


class _BufferRef:
    """A recorded operand: which allocation (held weakly, as a graph holds no memory) and which
    view of it; a scalar or index is recorded by value."""

    def __init__(self, array):
        owner = array
        while isinstance(owner.base, numpy.ndarray):
            owner = owner.base
        self.owner = weakref.ref(owner)
        self.allocation = owner
        self.whole = array is owner
        self.view = (array.shape, array.dtype, array.ctypes.data - owner.ctypes.data, array.strides)
        self.nbytes = owner.nbytes

    def resolve(self, node):
        owner = self.owner()
        if owner is None:
            raise GraphReplayError(f"cudaErrorIllegalAddress: the graph's step {node} uses a buffer of {self.nbytes} "
                                   "bytes that was freed after the capture (the memory pool may have given it to "
                                   "another array); keep every buffer a graph touches alive while the graph lives")
        if self.whole:
            return owner
        shape, dtype, offset, strides = self.view
        return numpy.ndarray(shape, dtype, buffer=owner, offset=offset, strides=strides)


def _refs(value):
    if isinstance(value, numpy.ndarray):
        return _BufferRef(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_refs(v) for v in value)
    if isinstance(value, dict):
        return {k: _refs(v) for k, v in value.items()}
    return value


def _resolve(value, node):
    if isinstance(value, _BufferRef):
        return value.resolve(node)
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, node) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, node) for k, v in value.items()}
    return value


def _buffer_refs(value):
    if isinstance(value, _BufferRef):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _buffer_refs(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _buffer_refs(v)


class _Node:
    """One recorded step: ``function`` on recorded operands, its value written into ``result``."""

    def __init__(self, function, args, kwargs, result, name):
        self.function, self.args, self.kwargs, self.result = function, _refs(args), _refs(kwargs), _refs(result)
        self.name = name

    def buffers(self):
        """The allocations this step reads or writes (each once), handed over once: a step holds none."""
        for ref in _buffer_refs((self.args, self.kwargs, self.result)):
            owner, ref.allocation = ref.allocation, None
            if owner is not None:
                yield owner

    def replay(self):
        value = self.function(*_resolve(self.args, self), **_resolve(self.kwargs, self))
        result = _resolve(self.result, self)
        if isinstance(result, numpy.ndarray):
            numpy.copyto(result, value)
        elif isinstance(result, (list, tuple)):
            for target, v in zip(result, value):
                if isinstance(target, numpy.ndarray):
                    numpy.copyto(target, v)

    def __str__(self):
        return f"#{self.index} ({self.name})"


class _Capture:
    """What a capturing stream recorded, and the contents of the buffers that existed when it began."""

    def __init__(self, device_id):
        self.nodes, self.invalid = [], None
        self.watch = _GraphBuffers()
        with _pool_lock:
            owners = [a for a in _owners.values()]
        self.before = {id(a): (weakref.ref(a), a.copy()) for a in owners}

    def undo(self):
        """Make the capture leave no trace, as on a GPU, where captured work does not run: every
        buffer that existed before is put back, and those made during the capture hold NaN (-1 for
        integers), as uninitialized memory might, so a graph that reads one before writing it shows."""
        with _pool_lock:
            owners = [a for a in _owners.values()]
        for array in owners:
            saved = self.before.get(id(array))
            if saved is not None and saved[0]() is array:
                numpy.copyto(array, saved[1])
            elif array.dtype.kind == "f" or array.dtype.kind == "c":
                array.fill(numpy.nan)
            elif array.dtype.kind in "iu":
                array.fill(-1)

    def record(self, function, args, kwargs, result, name=None):
        if getattr(function, "__name__", None) in ("empty", "empty_like"):
            return  # an allocation, no kernel: nothing to replay
        node = _Node(function, args, kwargs, result, name or getattr(function, "__name__", str(function)))
        node.index = len(self.nodes)
        self.nodes.append(node)
        for owner in node.buffers():
            self.watch.add(owner, node)

    def invalidate(self, why):
        self.invalid = self.invalid or why


class Graph:
    """A captured graph: ``launch`` re-runs its recorded steps in order, on the buffers they recorded.
    While it lives, every buffer it recorded must stay allocated (``standin_freed_graph_buffers``)."""

    def __init__(self, nodes, device_id, watch=None):
        self._nodes, self._device_id = nodes, device_id
        self._watch = watch
        if watch is not None:
            watch.graph_made()

    def launch(self, stream=None):
        """Replay the graph on ``stream`` (default: the current one); on a stream other than the null
        stream the replay waits, as NCCL work does here, until something waits for that stream, so
        host code that overwrites the graph's inputs without ordering itself after the launch
        changes what the launch computes, as it would on a GPU."""
        if _capture() is not None:
            raise runtime.CUDARuntimeError("cudaErrorStreamCaptureUnsupported: the stand-in launches no graph "
                                           "inside another capture")
        (stream or get_current_stream())._enqueue(self._replay)

    def _replay(self):
        with Device(self._device_id):
            for node in self._nodes:
                node.replay()

    def upload(self, stream=None):
        pass

    @property
    def node_count(self) -> int:
        """Recorded steps (kernels, copies and cuBLAS calls)."""
        return len(self._nodes)


# ----- the buffers of live graphs -----
_freed_graph_buffers = []  # one message per buffer freed to the device while a graph that uses it lived


def standin_freed_graph_buffers() -> list:
    """What was freed to the device while a captured graph that reads or writes it was alive (one
    message each, oldest first): an array of the default pool that died (CuPy's pool hands its
    memory to the next array that asks), an array of a pool of one's own whose memory the pool gave
    back (``free_all_blocks``, or the pool itself gone). On a GPU each is memory that the next
    replay reads or overwrites while it belongs to someone else (another array, another library)."""
    return list(_freed_graph_buffers)


def standin_forget_freed_graph_buffers() -> None:
    """Empty the list ``standin_freed_graph_buffers`` returns."""
    _freed_graph_buffers.clear()


class _GraphBuffers:
    """Every allocation one capture recorded, watched until its graph goes: a death of one (its
    memory back with the device or the default pool) while the capture or its graph lives is
    recorded. Frees during a capture count once the capture has become a graph (an abandoned
    capture leaves no graph to replay)."""

    def __init__(self):
        self._watched = {}  # id(allocation) -> weak reference with a callback
        self._pending = []
        self._made = False

    def add(self, owner, node) -> None:
        known = self._watched.get(id(owner))
        if known is not None and known() is owner:
            return
        me = weakref.ref(self)
        what = (f"a buffer of {owner.nbytes} bytes ({owner.dtype}{list(owner.shape)}) that the graph's step "
                f"#{node.index} ({node.name}) reads or writes")

        def freed(_, me=me, what=what):
            watch = me()
            if watch is None:
                return
            if watch._made:
                _freed_graph_buffers.append(f"{what} went back to the device while the graph lives")
            else:
                watch._pending.append(f"{what} went back to the device during its capture")

        self._watched[id(owner)] = weakref.ref(owner, freed)

    def graph_made(self) -> None:
        self._made = True
        _freed_graph_buffers.extend(self._pending)
        self._pending = []


class _StandinCublas:
    """cuBLAS's GEMM as ``tinygrad_caps.kernels.gemm`` calls it (allowed in a capture, as cuBLAS is);
    precision "high" rounds float32 operands to TF32's 10-bit mantissa first, as tensor cores do. The
    workspace (a uint8 array on the GPU) is recorded as a buffer of the call, as cuBLAS uses it."""

    def matmul(self, a, b, out, precision, workspace=None):
        device = _current_device()
        for name, x in (("a", a), ("b", b), ("out", out), ("workspace", workspace)):
            if (x is not None or name != "workspace") and (not isinstance(x, ndarray) or x._device != device):
                raise runtime.CUDARuntimeError(f"cudaErrorIllegalAddress: cuBLAS operand {name} is not an array on "
                                               f"the current GPU {device}")
        function = _tf32_matmul if precision == "high" and out.dtype == numpy.float32 else numpy.matmul
        function(a._a, b._a, out=out._a)
        capture = _capture()
        if capture is not None:
            def gemm(a, b, workspace, out):
                return function(a, b, out=out)

            capture.record(gemm, (a._a, b._a, None if workspace is None else workspace._a), {"out": out._a}, None,
                           "cublasGemmEx")


def _tf32(x):
    bits = numpy.ascontiguousarray(x, dtype=numpy.float32).view(numpy.uint32)
    return ((bits + numpy.uint32(0x1000)) & numpy.uint32(0xFFFFE000)).view(numpy.float32)


def _tf32_matmul(a, b, out):
    return numpy.matmul(_tf32(a), _tf32(b), out=out)


standin_cublas = _StandinCublas()


# ----- memory pool and hooks -----
_hooks = threading.local()


class MemoryHook:
    """Base class of memory hooks: within ``with hook:``, ``malloc_postprocess(**info)`` and
    ``free_postprocess(**info)`` see every array made or freed (info: device_id, mem_size, mem_ptr)."""

    name = "MemoryHook"

    def __enter__(self):
        if not hasattr(_hooks, "active"):
            _hooks.active = []
        _hooks.active.append(self)
        return self

    def __exit__(self, *exc):
        _hooks.active.remove(self)

    def malloc_preprocess(self, **info):
        pass

    def malloc_postprocess(self, **info):
        pass

    def free_preprocess(self, **info):
        pass

    def free_postprocess(self, **info):
        pass


def _memory_event(kind, device, size, pointer):
    for hook in list(getattr(_hooks, "active", ())):
        info = dict(device_id=device, mem_size=size, mem_ptr=pointer, pmem_id=0)
        if kind == "malloc":
            hook.malloc_preprocess(device_id=device, size=size, mem_size=size)
            hook.malloc_postprocess(**info)
        else:
            hook.free_preprocess(**info)
            hook.free_postprocess(**info)


class _DefaultPool(MemoryPool):
    """The default pool: every array not made through an allocator of one's own, counted in ``_live``."""

    def malloc(self, size):
        """A MemoryPointer that will hold the next array's memory (see ``set_allocator``)."""
        return MemoryPointer(0, _current_device())

    def used_bytes(self):
        from .. import _live, _pool_lock

        with _pool_lock:
            return sum(size for device, size in _live.values() if device == _current_device())

    total_bytes = used_bytes

    def free_bytes(self):
        return 0

    def n_free_blocks(self):
        return 0

    def free_all_blocks(self, stream=None):
        pass


_POOL = _DefaultPool()


_allocator = threading.local()


def set_allocator(allocator=None):
    """Allocate every new array of this thread through ``allocator(size) -> MemoryPointer``; the
    array's memory then lives as long as that MemoryPointer (None: the default pool)."""
    _allocator.current = allocator


def get_allocator():
    return getattr(_allocator, "current", None) or _POOL.malloc


@contextlib.contextmanager
def using_allocator(allocator=None):
    """``set_allocator`` for this thread within the context; the one before comes back after it."""
    previous = getattr(_allocator, "current", None)
    _allocator.current = allocator
    try:
        yield
    finally:
        _allocator.current = previous


def _allocated(array, size):
    """Called for every new array: a custom allocator's MemoryPointer holds the array's memory."""
    allocator = getattr(_allocator, "current", None)
    if allocator is not None and allocator != _POOL.malloc:
        allocator(size)._hold(array)


def set_pinned_memory_allocator(allocator=None):
    pass


# ----- RawModule: our kernels on the CPU emulation -----
_emulator = None
_emulator_lock = threading.Lock()
_libraries_lock = threading.Lock()


def _emulator_instance():
    global _emulator
    with _emulator_lock:
        if _emulator is None:
            from tinygrad_caps.kernels.checking.emulation import Emulator

            _emulator = Emulator()
        return _emulator


class RawKernel:
    def __init__(self, name, code):
        self.name, self._code = name, code

    def __call__(self, grid, block, args, *, shared_mem=0, stream=None, enable_cooperative_groups=False):
        from tinygrad_caps.kernels.launch import KernelLaunch

        device = _current_device()
        host_args = []
        for k, arg in enumerate(args):
            if isinstance(arg, ndarray):
                if arg._device != device:
                    raise runtime.CUDARuntimeError(f"cudaErrorIllegalAddress: {self.name} argument {k} lives on "
                                                   f"GPU {arg._device}, the launch runs on GPU {device}")
                host_args.append(arg._a)
            elif isinstance(arg, numpy.ndarray):
                raise TypeError(f"Unsupported type {type(arg)} ({self.name} argument {k})")
            elif isinstance(arg, numpy.generic):
                host_args.append(arg)
            else:
                # CuPy would pass a Python int as 64 bits and a float as a double, whatever the
                # kernel's parameter type: refuse what would be read wrongly on the GPU
                raise TypeError(f"{self.name} argument {k} is a Python {type(arg).__name__}; "
                                f"pass a sized NumPy scalar (numpy.int32, numpy.float32...)")
        grid = tuple(grid) if isinstance(grid, tuple) else (grid,)
        block = tuple(block) if isinstance(block, tuple) else (block,)
        name = self.name

        def launch(*args):
            _emulator_instance()(KernelLaunch("standin", name, grid, block, tuple(args), (), int(shared_mem)))

        launch(*host_args)
        capture = _capture()
        if capture is not None:
            capture.record(launch, tuple(host_args), {}, None, name)


class RawModule:
    def __init__(self, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, log_stream=None, jitify=False):
        if code is None:
            raise NotImplementedError("the stand-in compiles code=... only")
        if not isinstance(options, tuple) or not all(isinstance(o, str) for o in options):
            raise TypeError(f"RawModule options must be a tuple of str, got {options!r}")
        self.code, self.options = code, options
        self._kernels = set(re.findall(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)',
                                       code))

    def compile(self, log_stream=None):
        compiler.compile_with_cache(self.code, self.options, _current_device())
        with _libraries_lock:  # pool threads compile modules in parallel; the emulation builds once
            _emulator_instance().libraries()

    def get_function(self, name):
        compiler.compile_with_cache(self.code, self.options, _current_device())  # CuPy compiles at first use
        if name not in self._kernels:
            raise runtime.CUDARuntimeError(f"cudaErrorNotFound: named symbol {name!r} not found in this module")
        return RawKernel(name, self.code)
