"""A stand-in for CuPy that runs on the CPU: the engine's GPU code path, tested without a GPU.

Put ``tests/support/cupy_standin`` first on ``PYTHONPATH`` and ``import cupy`` gets this package. Arrays
are NumPy arrays in a wrapper that behaves the way CuPy's does where our code could go wrong
without a GPU to tell it:

- an array lives on the GPU that was current when it was made (``cupy.cuda.Device(n)``; the
  stand-in has ``CUPY_STANDIN_DEVICES`` GPUs, default 1). Computing on an array while another GPU
  is current raises the ``ValueError`` CuPy raises between GPUs without peer access (with peer
  access CuPy 14 enables it and runs the work, slowly, on the current GPU: the same bug, unseen);
  views (transpose, basic slicing, a reshape that needs no copy) and copies to the host
  (``get()``, ``float()``) work from any device, as in CuPy, and a copy lands on the current GPU;
- no implicit conversion to NumPy: ``numpy.asarray(a)`` raises ``TypeError``, and a NumPy array
  operand of a CuPy function or operator raises ``TypeError`` (only ``array``/``asarray`` take
  host data), so a forgotten ``.get()`` or a NumPy array left in a GPU graph shows here;
- reductions return 0-d arrays, not NumPy scalars;
- ``RawModule(code=...).get_function(name)`` launches run on the CPU emulation of our kernels
  (``tinygrad_caps.kernels.checking.emulation``), with CUDA's launch limits. The kernel must be in that
  module's code, every array argument on the current GPU, and every scalar a sized NumPy scalar
  (CuPy would pass a Python int as a 64-bit value to an ``int`` parameter, silently);
- ``cupy.cuda``: devices, streams, events (timed on the host), ``MemoryHook`` with malloc/free
  callbacks for every new array, the default memory pool's ``used_bytes``; ``cupy.cuda.nccl``:
  one rank, or one per ``mpirun`` process through MPI, its collectives on a side stream deferred
  until something waits for them;
- stream capture (``Stream.begin_capture``/``end_capture``, ``Graph.launch``): work issued while
  the current stream captures is recorded, and, as on a GPU, has no effect until the graph is
  launched (it runs at once, so that results have shapes, and ``end_capture`` puts back every
  buffer that existed before and fills those made during the capture with NaN or -1); a launch
  re-runs every recorded step on the same buffers with the same scalars. What CuPy refuses in a capture is
  refused here with CuPy's errors: host transfers both ways, synchronization (which invalidates
  the capture), cuBLAS (``matmul``, ``dot``, ``einsum``...) and cuRAND (``cupy.random``). The graph
  holds no buffer alive, as on a GPU: a launch that finds a buffer it recorded freed (CuPy's pool
  would have handed it to another array) raises instead of silently corrupting; memory from an
  allocator set with ``cupy.cuda.set_allocator`` lives as long as the returned ``MemoryPointer``,
  and a pool of one's own (``cupy.cuda.MemoryPool()``) is modelled chunk by chunk, overwriting
  what is freed (``cuda/_pool.py``);
- ``RawModule`` compiles through a model of CuPy's on-disk kernel cache (``cuda/compiler.py``);
- ``cupy.cuda.standin_cublas``: what ``tinygrad_caps.kernels.gemm`` calls instead of cuBLAS
  through ctypes (allowed in a capture, as cuBLAS is).

It is not CuPy: everything else runs synchronously on the host, nothing is measured, dtype rules are
NumPy's. It exists to run the code that only a GPU runs before a GPU runs it. Test use only.
"""
from __future__ import annotations

import numbers
import operator
import os
import threading
import types
import weakref

import numpy
from numpy.lib.mixins import NDArrayOperatorsMixin

__version__ = "0.0.0+cpu-standin"
STANDIN = True
DEVICE_COUNT = int(os.environ.get("CUPY_STANDIN_DEVICES", "1"))

_local = threading.local()
# Functions and methods that only make a view or read metadata: CuPy allows them on any device.
_VIEWS = frozenset({"reshape", "transpose", "swapaxes", "squeeze", "expand_dims", "broadcast_to", "moveaxis",
                    "view", "as_strided", "shape", "ndim", "size", "result_type", "can_cast", "iscomplexobj", "isrealobj",
                    "may_share_memory", "shares_memory", "get", "item", "tolist", "tobytes", "__array_namespace__"})
_HOST_INPUT = frozenset({"array", "asarray", "asanyarray"})  # the only functions that take host data
_HOST_VIEWS = frozenset({"get", "item", "tolist", "tobytes"})  # copies to the host, never recorded


def _current_device() -> int:
    return getattr(_local, "device", 0)


def _allocation_of(pointer: int):
    """(device, start, bytes) of the live array whose memory holds ``pointer``, or None."""
    with _pool_lock:
        for start, (device, nbytes) in _allocations.items():
            if start <= pointer < start + max(nbytes, 1):
                return device, start, nbytes
    return None


def _require_on(array, device):
    """Raise the ValueError CuPy raises between GPUs without peer access unless ``array`` is on ``device``."""
    if array._device != device:
        raise ValueError(f"The device where the array resides ({array._device}) is different from the current "
                         f"device ({device}). Peer access is unavailable between these devices.")


def _view_device(result, device, inputs=()):
    """Where a view function's ``result`` lives: with its input (``device``), unless it had to copy
    (a reshape of a strided array), which CuPy does onto the current GPU."""
    return _current_device() if _view_copied(result, inputs) else device


def _unwrap(value, device, name):
    """The NumPy data under ``value`` (recursing into lists and tuples). ``device`` is the GPU the
    computation runs on (None: a view, any device)."""
    if isinstance(value, ndarray):
        if device is not None:
            _require_on(value, device)
        return value._a
    if isinstance(value, numpy.ndarray):
        raise TypeError(f"Unsupported type {type(value)} in cupy {name}: a NumPy array needs cupy.asarray first")
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v, device, name) for v in value)
    return value


def _unwrap_key(key, device):
    """Index keys may hold NumPy index arrays (CuPy uploads them) and CuPy arrays on ``device``."""
    if isinstance(key, tuple):
        return tuple(_unwrap_key(k, device) for k in key)
    if isinstance(key, ndarray):
        _require_on(key, device)
        return key._a
    return key


def _is_basic_key(key) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return all(k is None or k is Ellipsis or isinstance(k, (slice, numbers.Integral)) for k in keys)


def _wrap(result, device):
    """Wrap NumPy results as arrays on ``device``; NumPy scalars become 0-d arrays, as in CuPy."""
    if isinstance(result, numpy.ndarray):
        return ndarray._from_numpy(result, device)
    if isinstance(result, numpy.generic):
        return ndarray._from_numpy(numpy.asarray(result), device)
    if isinstance(result, (numpy.random.Generator, numpy.random.RandomState)):
        return _Namespace(result, "cuRAND")  # its draws are arrays on the current device
    if isinstance(result, (list, tuple)) and any(isinstance(r, (numpy.ndarray, numpy.generic)) for r in result):
        return type(result)(_wrap(r, device) for r in result)
    return result


def _array_device(values, default):
    for v in values:
        if isinstance(v, ndarray):
            return v._device
        if isinstance(v, (list, tuple)):
            found = _array_device(v, None)
            if found is not None:
                return found
    return default


def _call(function, name, args, kwargs):
    """Run NumPy's ``function`` the way CuPy runs its own: on the current device, every array there."""
    if name in _VIEWS:
        device = _array_device(list(args) + list(kwargs.values()), _current_device())
        args, kwargs = _unwrap(args, None, name), {k: _unwrap(v, None, name) for k, v in kwargs.items()}
        result = function(*args, **kwargs)
        if _view_copied(result, (args, kwargs)):
            _record(function, args, kwargs, result)
        return _wrap(result, _view_device(result, device, (args, kwargs)))
    _refuse_library_in_capture(name)
    device = _current_device()
    out = kwargs.get("out")
    args = _unwrap(args, device, name)
    kwargs = {k: _unwrap(v, device, name) for k, v in kwargs.items()}
    result = _as_array(function(*args, **kwargs))
    _record(function, args, kwargs, result if out is None else None)
    if out is not None:  # the caller's arrays, written in place
        return out[0] if isinstance(out, tuple) and len(out) == 1 else out
    return _wrap(result, device)


# ----- stream capture: what runs while the current stream captures is recorded for replay -----
# Functions CuPy runs through cuBLAS (or cuSOLVER), which it refuses while a stream captures.
_CUBLAS = frozenset({"matmul", "dot", "tensordot", "einsum", "inner", "vdot", "solve", "inv", "svd", "qr", "cholesky",
                     "eigh", "lstsq", "det", "slogdet", "pinv"})


def _capture():
    """The capture the current stream records into, or None."""
    stream = getattr(_local, "stream", None)
    return getattr(stream, "_capture", None)


def _refuse_library_in_capture(name, library=None):
    if _capture() is None:
        return
    library = library or ("cuBLAS" if name.split(".")[0] in _CUBLAS else None)
    if library is not None:
        raise NotImplementedError(f"calling {library} API during stream capture is currently unsupported")


def _refuse_transfer(direction: str) -> None:
    """CuPy's error for a host transfer (``"H2D"`` or ``"D2H"``) while the current stream captures."""
    if _capture() is not None:
        raise RuntimeError(f"the current stream is capturing, so {direction} transfers are disallowed")


def _view_copied(result, inputs) -> bool:
    """Whether a view function copied: its result shares no memory with any array among ``inputs``
    (NumPy's reshape of a strided array returns a view of a fresh copy, so ``base`` cannot tell)."""
    if not isinstance(result, numpy.ndarray) or not result.size:
        return False
    arrays = [a for a in _flatten(inputs) if isinstance(a, numpy.ndarray)]
    return not any(numpy.may_share_memory(result, a) for a in arrays)


def _flatten(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flatten(v)
        elif isinstance(v, dict):
            yield from _flatten(v.values())
        else:
            yield v


def _record(function, args, kwargs, result=None):
    """Record ``function(*args, **kwargs)`` (NumPy data) in the current capture, if any: a replay
    calls it again on the same buffers and writes what it returns into ``result``'s buffer."""
    capture = _capture()
    if capture is not None:
        capture.record(function, args, kwargs, result)


# ----- memory accounting: every new array is one pool allocation -----
_pool_lock = threading.Lock()
_live = {}  # id(numpy array) -> (device, size)
_owners = weakref.WeakValueDictionary()  # id(numpy array) -> the array, for every live allocation
_allocations = {}  # data pointer -> (device, bytes): what a raw pointer (NCCL's arguments) points into


def _pool_size(nbytes: int) -> int:
    return max(512, -(-nbytes // 512) * 512)


def _track(array: numpy.ndarray, device: int) -> None:
    """Count a new array's memory as one pool allocation (a view's: its owner's, if not counted yet)."""
    while isinstance(array.base, numpy.ndarray):
        array = array.base
    if id(array) in _live or array.base is not None:
        return
    size = _pool_size(array.nbytes)
    key = id(array)
    pointer = array.ctypes.data
    with _pool_lock:
        _live[key] = (device, size)
        _owners[key] = array
        _allocations[pointer] = (device, array.nbytes)
    from .cuda import _allocated, _memory_event

    _allocated(array, size)
    _memory_event("malloc", device, size, pointer)

    def free():
        with _pool_lock:
            _live.pop(key, None)
            _allocations.pop(pointer, None)
        _memory_event("free", device, size, pointer)

    weakref.finalize(array, free)


class ndarray(NDArrayOperatorsMixin):
    """A CuPy array stand-in: NumPy data on one (stand-in) GPU. See the module docstring."""

    __array_priority__ = 100
    __hash__ = None

    def __init__(self, shape, dtype=float, order="C"):
        self._a = numpy.empty(shape, dtype=dtype, order=order)
        self._device = _current_device()
        _track(self._a, self._device)

    @classmethod
    def _from_numpy(cls, a: numpy.ndarray, device: int) -> "ndarray":
        obj = object.__new__(cls)
        obj._a, obj._device = a, device
        _track(a, device)
        return obj

    # ----- NumPy protocols -----
    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _call(getattr(ufunc, method), f"{ufunc.__name__}.{method}", inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return _call(func, func.__name__, args, kwargs)

    # ----- metadata -----
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: _wrap(self._a.T, self._device))

    @property
    def device(self):
        from .cuda import Device

        return Device(self._device)

    @property
    def data(self):
        from .cuda import MemoryPointer

        return MemoryPointer(self._a.ctypes.data, self._device)

    @property
    def base(self):
        return None if self._a.base is None else ndarray._from_numpy(self._a.base, self._device)

    # ----- host transfers -----
    def get(self, stream=None, order="C", out=None, blocking=True):
        """A NumPy copy of the data (from any device)."""
        _refuse_transfer("D2H")
        if out is not None:
            out[...] = self._a
            return out
        return numpy.array(self._a, order=order, copy=True)

    def set(self, array, stream=None):
        if not isinstance(array, numpy.ndarray):
            raise TypeError(f"set takes a numpy.ndarray, got {type(array)}")
        _refuse_transfer("H2D")
        self._a[...] = array

    def item(self, *args):
        _refuse_transfer("D2H")
        return self._a.item(*args)

    def tolist(self):
        _refuse_transfer("D2H")
        return self._a.tolist()

    def __float__(self):
        _refuse_transfer("D2H")
        return float(self._a)

    def __int__(self):
        _refuse_transfer("D2H")
        return int(self._a)

    def __complex__(self):
        _refuse_transfer("D2H")
        return complex(self._a)

    def __bool__(self):
        _refuse_transfer("D2H")
        return bool(self._a)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[k] for k in range(len(self)))

    def __repr__(self):
        return repr(self._a)

    def __str__(self):
        return str(self._a)

    def __format__(self, spec):
        return format(self._a.item() if self.ndim == 0 else self._a, spec)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        return _rebuild, (self.get(), self._device)

    # ----- DLPack: NumPy's export of the data, told as device memory of this stand-in GPU -----
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self._a.__dlpack__(**({"max_version": max_version} if max_version is not None else {}))

    def __dlpack_device__(self):
        return (2, self._device)  # kDLCUDA

    # ----- indexing -----
    def __getitem__(self, key):
        basic = _is_basic_key(key)
        device = self._device if basic else _current_device()
        if not basic:  # advanced indexing runs a kernel
            _require_on(self, device)
        unwrapped = _unwrap_key(key, device)
        result = self._a[unwrapped]
        if basic and isinstance(result, numpy.generic):  # CuPy gives a 0-d view, NumPy a scalar (a copy)
            result = self._a[(*(unwrapped if isinstance(unwrapped, tuple) else (unwrapped,)), Ellipsis)]
        if not basic:
            _record(operator.getitem, (self._a, unwrapped), {}, result)
        return _wrap(result, self._device)

    def __setitem__(self, key, value):
        device = _current_device()
        _require_on(self, device)
        if isinstance(value, ndarray):
            _require_on(value, device)
            value = value._a
        elif isinstance(value, numpy.ndarray) and value.ndim and _is_basic_key(key):
            # CuPy sends a basic-index assignment of a non-array value to fill(), which refuses it
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        unwrapped = _unwrap_key(key, device)
        self._a[unwrapped] = value
        _record(operator.setitem, (self._a, unwrapped, value), {})

    # ----- everything else: NumPy's method, run as CuPy runs it -----
    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        if not copy and numpy.dtype(dtype) == self.dtype:
            return self  # no kernel, so from any device, as in CuPy
        return _method(self, self._a.astype, "astype", (dtype,), {"order": order, "copy": True})

    def copy(self, order="C"):
        # CuPy copies onto the current device
        result = numpy.array(self._a, order=order, copy=True)
        _record(numpy.array, (self._a,), {"order": order, "copy": True}, result)
        return _wrap(result, _current_device())

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        attribute = getattr(self._a, name)
        if not callable(attribute):
            return _wrap(attribute, self._device)
        return lambda *args, **kwargs: _method(self, attribute, name, args, kwargs)

    def scatter_add(self, slices, value):
        """``cupyx.scatter_add``: ``self[slices] += value`` with repeated indices accumulated."""
        device = _current_device()
        _require_on(self, device)
        args = (self._a, _unwrap_key(slices, device), _unwrap(value, device, "scatter_add"))
        numpy.add.at(*args)
        _record(numpy.add.at, args, {})


def _method(array, bound, name, args, kwargs):
    if name in _VIEWS:
        if name in _HOST_VIEWS:
            _refuse_transfer("D2H")
        args, kwargs = _unwrap(args, None, name), {k: _unwrap(v, None, name) for k, v in kwargs.items()}
        result = bound(*args, **kwargs)
        inputs = (array._a, args, kwargs)
        if _view_copied(result, inputs) and name not in _HOST_VIEWS:
            _record(bound, args, kwargs, result)
        return _wrap(result, _view_device(result, array._device, inputs))
    _require_on(array, _current_device())
    _refuse_library_in_capture(name)
    args = _unwrap(args, array._device, name)
    kwargs = {k: _unwrap(v, array._device, name) for k, v in kwargs.items()}
    result = _as_array(bound(*args, **kwargs))
    _record(bound, args, kwargs, result)
    return _wrap(result, array._device)


def _as_array(result):
    """A NumPy scalar or Python number result as the 0-d array CuPy returns (``count_nonzero`` of
    NumPy returns an int), so a replay writes into it."""
    if isinstance(result, (numpy.generic, numbers.Number)) and not isinstance(result, bool):
        return numpy.asarray(result)
    return result


def _rebuild(host, device):
    from .cuda import Device

    with Device(device):
        return asarray(host)


# ----- functions -----
def array(obj, dtype=None, copy=True, order="K", ndmin=0):
    """An array on the current device from host data or a CuPy array (copied unless allowed not to)."""
    device = _current_device()
    if isinstance(obj, ndarray):
        if not copy and obj._device == device and (dtype is None or numpy.dtype(dtype) == obj.dtype):
            return obj
        kwargs = dict(dtype=dtype, copy=True, order=order, ndmin=ndmin)
        result = numpy.array(obj._a, **kwargs)
        _record(numpy.array, (obj._a,), kwargs, result)
        return _wrap(result, device)
    _refuse_transfer("H2D")
    if isinstance(obj, (list, tuple)) and any(isinstance(o, ndarray) for o in obj):
        obj = [o.get() if isinstance(o, ndarray) else o for o in obj]
    return _wrap(numpy.array(obj, dtype=dtype, copy=True, order=order, ndmin=ndmin), device)


def asarray(a, dtype=None, order=None):
    """``a`` itself when it is already on the current device with this dtype, else a copy there."""
    return array(a, dtype=dtype, copy=False, order=order or "K")


asanyarray = asarray


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    """A NumPy array of ``a`` (a copy for CuPy arrays)."""
    if isinstance(a, ndarray):
        return a.get(order=order, out=out)
    return numpy.asarray(a, order=order)


class _AsHostMemory:
    """What the stand-in hands NumPy's importer: the producer's export, told as host memory."""

    def __init__(self, producer):
        self._producer = producer

    def __dlpack__(self, **kwargs):
        return self._producer.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (1, 0)


def from_dlpack(obj):
    """CuPy's importer: shares the memory of ``obj`` when it is device memory (kDLCUDA) of a stand-in GPU."""
    device_type, device_id = obj.__dlpack_device__()
    if device_type != 2:
        raise BufferError(f"from_dlpack: CuPy imports CUDA memory, got device type {device_type}")
    return ndarray._from_numpy(numpy.from_dlpack(_AsHostMemory(obj)), int(device_id))


def get_array_module(*args):
    return __import__(__name__) if any(isinstance(a, ndarray) for a in args) else numpy


class ufunc:
    """A NumPy ufunc run as CuPy's (``cupy.add(a, b)``, ``cupy.maximum.reduce``...)."""

    def __init__(self, numpy_ufunc):
        self._u = numpy_ufunc
        self.__name__ = numpy_ufunc.__name__

    def __call__(self, *args, **kwargs):
        return _call(self._u, self.__name__, args, kwargs)

    def __getattr__(self, name):
        attribute = getattr(self._u, name)
        if callable(attribute):
            return lambda *args, **kwargs: _call(attribute, f"{self.__name__}.{name}", args, kwargs)
        return attribute


class _Namespace:
    """A NumPy submodule (``linalg``, ``random``, ``lib.stride_tricks``...) whose functions return
    stand-in arrays; ``library`` names the CUDA library that CuPy runs its functions through when
    that one refuses a stream capture (cuRAND for ``random``)."""

    def __init__(self, module, library=None):
        self._module, self._library = module, library

    def __getattr__(self, name):
        return _translate(getattr(self._module, name), name, self._library)


def _translate(attribute, name, library=None):
    if isinstance(attribute, types.ModuleType):
        return _Namespace(attribute, "cuRAND" if attribute is numpy.random else library)
    if isinstance(attribute, numpy.ufunc):
        return ufunc(attribute)
    if isinstance(attribute, type) or not callable(attribute):
        return attribute  # dtypes, constants, numpy.dtype itself
    if name in _HOST_INPUT:
        return globals()[name]

    def run(*args, **kwargs):
        _refuse_library_in_capture(name, library)
        return _call(attribute, name, args, kwargs)

    return run


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _translate(getattr(numpy, name), name)


def get_default_memory_pool():
    from .cuda import _POOL

    return _POOL


def get_default_pinned_memory_pool():
    from .cuda import _POOL

    return _POOL


from . import cuda  # noqa: E402  (cupy.cuda is an attribute of cupy, as in CuPy)
from .cuda import RawKernel, RawModule  # noqa: E402,F401
