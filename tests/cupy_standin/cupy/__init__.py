"""A stand-in for CuPy that runs on the CPU: the engine's GPU code path, tested without a GPU.

Put ``tests/cupy_standin`` first on ``PYTHONPATH`` and ``import cupy`` gets this package. Arrays
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
  (``tinygrad_caps.kernels.emulation``), with CUDA's launch limits. The kernel must be in that
  module's code, every array argument on the current GPU, and every scalar a sized NumPy scalar
  (CuPy would pass a Python int as a 64-bit value to an ``int`` parameter, silently);
- ``cupy.cuda``: devices, streams, events (timed on the host), ``MemoryHook`` with malloc/free
  callbacks for every new array, the default memory pool's ``used_bytes``; ``cupy.cuda.nccl``:
  one rank, or one per ``mpirun`` process through MPI, its collectives on a side stream deferred
  until something waits for them.

It is not CuPy: everything else runs synchronously on the host, nothing is measured, dtype rules are
NumPy's. It exists to run the code that only a GPU runs before a GPU runs it. Test use only.
"""
from __future__ import annotations

import numbers
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


def _view_device(result, device):
    """Where a view function's ``result`` lives: with its input (``device``), unless it had to copy
    (a reshape of a strided array), which CuPy does onto the current GPU."""
    copied = isinstance(result, numpy.ndarray) and result.base is None and result.size
    return _current_device() if copied else device


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
        return _Namespace(result)  # its draws are arrays on the current device
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
        result = function(*_unwrap(args, None, name), **{k: _unwrap(v, None, name) for k, v in kwargs.items()})
        return _wrap(result, _view_device(result, device))
    device = _current_device()
    out = kwargs.get("out")
    args = _unwrap(args, device, name)
    kwargs = {k: _unwrap(v, device, name) for k, v in kwargs.items()}
    result = function(*args, **kwargs)
    if out is not None:  # the caller's arrays, written in place
        return out[0] if isinstance(out, tuple) and len(out) == 1 else out
    return _wrap(result, device)


# ----- memory accounting: every new array is one pool allocation -----
_pool_lock = threading.Lock()
_live = {}  # id(numpy array) -> (device, size)
_allocations = {}  # data pointer -> (device, bytes): what a raw pointer (NCCL's arguments) points into


def _pool_size(nbytes: int) -> int:
    return max(512, -(-nbytes // 512) * 512)


def _track(array: numpy.ndarray, device: int) -> None:
    if array.base is not None or id(array) in _live:
        return
    size = _pool_size(array.nbytes)
    key = id(array)
    pointer = array.ctypes.data
    with _pool_lock:
        _live[key] = (device, size)
        _allocations[pointer] = (device, array.nbytes)
    from .cuda import _memory_event

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
        if out is not None:
            out[...] = self._a
            return out
        return numpy.array(self._a, order=order, copy=True)

    def set(self, array, stream=None):
        if not isinstance(array, numpy.ndarray):
            raise TypeError(f"set takes a numpy.ndarray, got {type(array)}")
        self._a[...] = array

    def item(self, *args):
        return self._a.item(*args)

    def tolist(self):
        return self._a.tolist()

    def __float__(self):
        return float(self._a)

    def __int__(self):
        return int(self._a)

    def __complex__(self):
        return complex(self._a)

    def __bool__(self):
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

    # ----- indexing -----
    def __getitem__(self, key):
        basic = _is_basic_key(key)
        device = self._device if basic else _current_device()
        if not basic:  # advanced indexing runs a kernel
            _require_on(self, device)
        return _wrap(self._a[_unwrap_key(key, device)], self._device)

    def __setitem__(self, key, value):
        device = _current_device()
        _require_on(self, device)
        if isinstance(value, ndarray):
            _require_on(value, device)
            value = value._a
        elif isinstance(value, numpy.ndarray) and value.ndim and _is_basic_key(key):
            # CuPy sends a basic-index assignment of a non-array value to fill(), which refuses it
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        self._a[_unwrap_key(key, device)] = value

    # ----- everything else: NumPy's method, run as CuPy runs it -----
    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        if not copy and numpy.dtype(dtype) == self.dtype:
            return self  # no kernel, so from any device, as in CuPy
        return _method(self, self._a.astype, "astype", (dtype,), {"order": order, "copy": True})

    def copy(self, order="C"):
        # CuPy copies onto the current device
        return _wrap(numpy.array(self._a, order=order, copy=True), _current_device())

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
        numpy.add.at(self._a, _unwrap_key(slices, device), _unwrap(value, device, "scatter_add"))


def _method(array, bound, name, args, kwargs):
    if name in _VIEWS:
        result = bound(*_unwrap(args, None, name), **{k: _unwrap(v, None, name) for k, v in kwargs.items()})
        return _wrap(result, _view_device(result, array._device))
    _require_on(array, _current_device())
    result = bound(*_unwrap(args, array._device, name), **{k: _unwrap(v, array._device, name) for k, v in kwargs.items()})
    return _wrap(result, array._device)


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
        return _wrap(numpy.array(obj._a, dtype=dtype, copy=True, order=order, ndmin=ndmin), device)
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
    """A NumPy submodule (``linalg``, ``random``, ``lib.stride_tricks``...) whose functions return stand-in arrays."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return _translate(getattr(self._module, name), name)


def _translate(attribute, name):
    if isinstance(attribute, types.ModuleType):
        return _Namespace(attribute)
    if isinstance(attribute, numpy.ufunc):
        return ufunc(attribute)
    if isinstance(attribute, type) or not callable(attribute):
        return attribute  # dtypes, constants, numpy.dtype itself
    if name in _HOST_INPUT:
        return globals()[name]
    return lambda *args, **kwargs: _call(attribute, name, args, kwargs)


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
