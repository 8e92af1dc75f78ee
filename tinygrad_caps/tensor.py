"""The Tensor: an array (NumPy or CuPy) plus what reverse-mode autodiff needs to know about it.

The ways to make a tensor, what each copies and where its data lands ("default device": the GPU
where there is one, else the CPU; see ``tinygrad_caps.backend``):

    way                          copies the data            device                      dtype
    ---------------------------  -------------------------  --------------------------  -----------------------
    tensor(data, dtype, device)  always                     ``device``; else a CuPy     ``dtype``; else the
                                                            array's own GPU; else the   array's; Python floats
                                                            default device (a NumPy     and float lists: the
                                                            array moves there too)      default float dtype
    Tensor(data, dtype, device)  only to convert, cast or   as tensor()                 as tensor()
                                 move: an array that stays
                                 where it is is shared
    leaf(array)                  never                      the array's                 the array's
    as_tensor(value, like=None)  never for a Tensor         beside ``like``: like's     beside ``like``:
                                 (returned as it is) or an  (a NumPy array with         PyTorch's promotion (a
                                 array; a number becomes a  dimensions beside a GPU     number takes like's
                                 new 0-d array              tensor: DeviceError);       dtype); else as
                                                            else an array's own, and    Tensor()
                                                            anything else as Tensor()
    zeros, ones, full, rand...   nothing to copy: new       ``device``; else default;   ``dtype``; else default
    (factories.py)               arrays                     *_like: like's              float (arange: NumPy's)
    Tensor._wrap(array)          never; checks nothing      the array's                 the array's
      (private)
    ops._common.constant(array)  never: it is leaf(array),  the array's                 the array's
      (private)                  named for what it holds
                                 (a mask, a scale)

``Tensor._wrap`` stays a constructor of its own: every op makes its output with it (and ``leaf``,
``tensor`` and ``as_tensor`` end in it), so it skips ``__init__`` (no device lookup, no dtype
rules) and sets the slots directly. ``leaf`` is ``_wrap`` plus ``requires_grad_``; ``tensor`` is
``Tensor``'s rules (``_as_array``) plus a copy.
"""
from __future__ import annotations

import numbers

import numpy as np

from . import autograd, backend
from .errors import GraphError

_default_float = np.dtype(np.float32)


def set_default_dtype(dtype) -> None:
    """Set the dtype given to Python floats and float lists by ``tensor()`` (float32 unless changed)."""
    global _default_float
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise ValueError(f"set_default_dtype: expected a floating dtype, got {dtype}")
    _default_float = dtype


def get_default_dtype() -> np.dtype:
    """The dtype that ``tensor()`` gives Python floats (float32 unless changed)."""
    return _default_float


def _as_array(data, dtype, device):
    if isinstance(data, Tensor):
        data = data.data
    is_array = isinstance(data, np.ndarray) or backend.is_cupy_array(data)
    target = backend.normalize_device(device) if device is not None else (
        backend.device_of(data) if backend.is_cupy_array(data) else backend.default_device()
    )
    xp = backend.module_for(target)
    if dtype is not None:
        dtype = np.dtype(dtype)
    elif not is_array and not isinstance(data, np.generic):
        probe = np.asarray(data)
        dtype = _default_float if probe.dtype == np.float64 else probe.dtype
    if target == "cpu":
        return xp.asarray(backend.to_numpy(data) if backend.is_cupy_array(data) else data, dtype=dtype)
    data = backend.to_device(data, target)  # stays on its GPU when it is there already
    with backend.on_device(target):
        return xp.asarray(data, dtype=dtype)


def _dlpack_array(data):
    """``data`` as an array that speaks DLPack: a NumPy scalar (what a full reduction such as
    ``x.sum()`` gives on the CPU) becomes a 0-d array of its dtype; arrays pass unchanged."""
    return np.asarray(data) if isinstance(data, np.generic) else data


class Tensor:
    """An n-dimensional array that records the ops applied to it, for reverse-mode differentiation.

    Attributes:
        data: the NumPy (CPU) or CuPy (CUDA) array holding the values.
        grad: a Tensor with the accumulated gradient, or None.
        requires_grad: whether ops on this tensor are recorded.
        creator: the Function that produced it (None for a leaf).
    """

    __slots__ = ("data", "grad", "requires_grad", "creator", "_hooks", "_retains_grad", "_vc", "_post_accumulate_hooks",
                 "__weakref__")
    __array_ufunc__ = None  # make NumPy defer to our reflected operators: ndarray * Tensor -> Tensor

    def __init__(self, data, dtype=None, device=None, requires_grad=False):
        self.data = _as_array(data, dtype, device)
        self.grad = None
        self.creator = None
        self._hooks = None
        self._retains_grad = False
        self._vc = None
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export the data through DLPack (``torch.from_dlpack(t)``, ``np.from_dlpack(t)``...): shared
        memory, the array's own protocol (the arguments are passed on where given)."""
        kwargs = {k: v for k, v in (("stream", stream), ("max_version", max_version), ("dl_device", dl_device),
                                    ("copy", copy)) if v is not None}
        return _dlpack_array(self.data).__dlpack__(**kwargs)

    def __dlpack_device__(self):
        """(device type, device id) as DLPack names them: (1, 0) on the CPU, (2, N) on GPU N."""
        return _dlpack_array(self.data).__dlpack_device__()

    @classmethod
    def _wrap(cls, array):
        """A leaf-like Tensor around ``array`` with no copy and no checks (the ops' fast path)."""
        t = object.__new__(Tensor)
        t.data, t.grad, t.creator, t._hooks, t._retains_grad, t.requires_grad = array, None, None, None, False, False
        t._vc = None  # version counter, a one-element list shared with views; created on first need
        return t

    # ----- properties -----
    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def device(self) -> str:
        return backend.device_of(self.data)

    @property
    def xp(self):
        """The array module (``numpy`` or ``cupy``) holding this tensor's data."""
        return backend.array_module(self.data)

    @property
    def is_leaf(self) -> bool:
        return self.creator is None

    @property
    def T(self) -> "Tensor":
        return F.transpose(self)

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        """Mark a leaf as needing gradients (floating dtypes only); returns self."""
        if flag and self.data.dtype.kind not in "fc":
            raise TypeError(f"only floating tensors can require grad; this one is {self.data.dtype}")
        if not flag and self.creator is not None:
            raise GraphError("requires_grad_(False) on a non-leaf; use .detach() instead")
        self.requires_grad = bool(flag)
        return self

    # ----- conversion -----
    def numpy(self) -> np.ndarray:
        """A NumPy array with this tensor's values (a host copy for CUDA tensors)."""
        return backend.to_numpy(self.data)

    def item(self):
        """The single value of a one-element tensor, as a Python number."""
        if self.data.size != 1:
            raise ValueError(f"item: the tensor has {self.data.size} elements, not 1 (shape {self.shape})")
        return self.data.reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def detach(self) -> "Tensor":
        """A new leaf sharing this tensor's data (and its version counter), with no graph and no gradient."""
        t = Tensor._wrap(self.data)
        t._vc = self._shared_version_counter()
        return t

    def to(self, device=None, dtype=None) -> "Tensor":
        """This tensor on ``device`` and/or as ``dtype`` (differentiable; self when nothing changes)."""
        out = self
        if dtype is not None and np.dtype(dtype) != self.dtype:
            out = F.cast(out, dtype)
        if device is not None and backend.normalize_device(device) != self.device:
            out = F.to_device(out, device)
        return out

    def astype(self, dtype) -> "Tensor":
        """This tensor cast to ``dtype`` (differentiable)."""
        return F.cast(self, dtype)

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def cuda(self) -> "Tensor":
        return self.to("cuda")

    # ----- autograd -----
    def backward(self, grad=None, retain_graph=False, create_graph=False) -> None:
        """Accumulate the gradient of this tensor into ``.grad`` of every leaf it depends on.

        Args:
            grad: seed gradient, same shape as this tensor; may be omitted for a one-element tensor.
            retain_graph: keep the graph so backward can run through it again.
            create_graph: record the backward pass, so ``.grad`` can be differentiated again.
        """
        autograd.backward(self, grad, retain_graph, create_graph)

    def register_hook(self, fn):
        """Call ``fn(grad)`` with the full gradient reaching this tensor; a non-None return replaces it.

        Returns a handle whose ``remove()`` unregisters the hook.
        """
        if not self.requires_grad:
            raise GraphError("register_hook on a tensor that does not require grad")
        if self._hooks is None:
            self._hooks = []
            if self.creator is not None:  # the node runs them, even if this Tensor object is dropped
                self.creator._hooks = self._hooks
        self._hooks.append(fn)
        return _HookHandle(self._hooks, fn)

    def register_post_accumulate_grad_hook(self, fn):
        """Call ``fn(tensor)`` on this leaf once per ``backward``, as soon as its ``.grad`` holds the
        gradient of that backward in full (after its ``register_hook`` hooks), while the rest of the
        backward goes on. Not called by ``tc.grad``. Returns a handle whose ``remove()`` unregisters it.
        """
        if not self.requires_grad or self.creator is not None:
            raise GraphError("register_post_accumulate_grad_hook needs a leaf tensor that requires grad")
        hooks = getattr(self, "_post_accumulate_hooks", None)
        if hooks is None:
            hooks = self._post_accumulate_hooks = []
        hooks.append(fn)
        return _HookHandle(hooks, fn)

    def retain_grad(self) -> None:
        """Keep ``.grad`` on this non-leaf tensor during ``backward`` (leaves always keep it)."""
        if not self.requires_grad:
            raise GraphError("retain_grad on a tensor that does not require grad")
        self._retains_grad = True

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def zero_grad(self) -> None:
        self.grad = None

    # ----- in-place updates (record no graph; bump the version counter) -----
    @property
    def _version(self) -> int:
        """How many in-place updates were made through the engine to this tensor's data (views share it)."""
        return 0 if self._vc is None else self._vc[0]

    def _shared_version_counter(self) -> list:
        """This tensor's version counter (a one-element list), created on first need, to share with a view."""
        if self._vc is None:
            self._vc = [0]
        return self._vc

    def _bump_version(self) -> None:
        """Count an in-place update of ``data`` (call after changing the array in place)."""
        if self._vc is None:
            self._vc = [1]
        else:
            self._vc[0] += 1

    def _check_inplace(self, op: str):
        if self.requires_grad and autograd.is_grad_enabled():
            if self.creator is None:
                raise GraphError(f"{op}: in-place update of a leaf that requires grad; "
                                 "do it under tc.no_grad() (as an optimizer step does)")
            raise GraphError(f"{op}: in-place update of a tensor that is part of a graph "
                             f"(shape {self.shape}); in-place ops record no graph, use the out-of-place op")
        if not isinstance(self.data, np.ndarray) and not backend.is_cupy_array(self.data):
            self.data = np.asarray(self.data)  # a NumPy scalar (a full reduction's result)
        flags = getattr(self.data, "flags", None)
        if flags is not None and not flags.writeable:
            raise ValueError(f"{op}: this tensor's data (shape {self.shape}) is a read-only array")

    def _operand_array(self, op: str, other):
        """``other`` as a number or an array on this tensor's device that broadcasts to this shape."""
        if isinstance(other, Tensor):
            other = other.data
        if isinstance(other, (numbers.Number, np.generic)):
            return other
        if not backend.is_cupy_array(other):
            other = np.asarray(other)
        try:
            fits = np.broadcast_shapes(other.shape, self.shape) == tuple(self.shape)
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"{op}: an operand of shape {tuple(other.shape)} does not broadcast to "
                             f"this tensor's shape {self.shape}")
        return backend.to_device(other, self.device)

    def copy_(self, src) -> "Tensor":
        """Copy ``src`` (Tensor, array or number broadcasting to this shape) into this tensor; returns self."""
        self._check_inplace("copy_")
        src = self._operand_array("copy_", src)
        with backend.on_device_of(self.data):  # CuPy computes on the current GPU
            self.xp.copyto(self.data, self.xp.asarray(src), casting="unsafe")
        self._bump_version()
        return self

    def zero_(self) -> "Tensor":
        """Set every element to 0; returns self."""
        return self.fill_(0)

    def fill_(self, value) -> "Tensor":
        """Set every element to the number ``value``; returns self."""
        self._check_inplace("fill_")
        with backend.on_device_of(self.data):
            self.data.fill(value)
        self._bump_version()
        return self

    def add_(self, other, alpha=1) -> "Tensor":
        """self += alpha * other (other broadcasts to this shape); returns self."""
        self._check_inplace("add_")
        other = self._operand_array("add_", other)
        with backend.on_device_of(self.data):
            if alpha != 1:
                other = other * alpha
            self.data += other
        self._bump_version()
        return self

    def mul_(self, other) -> "Tensor":
        """self *= other (other broadcasts to this shape); returns self."""
        self._check_inplace("mul_")
        other = self._operand_array("mul_", other)
        with backend.on_device_of(self.data):
            self.data *= other
        self._bump_version()
        return self

    # ----- Python protocol -----
    def __repr__(self):
        extra = f", device='{self.device}'" if self.device != "cpu" else ""
        grad = ", requires_grad=True" if self.requires_grad else ""
        body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype}{extra}{grad})"

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.data.shape[0]

    def __bool__(self):
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    __hash__ = object.__hash__

    # ----- arithmetic -----
    def __add__(self, other): return F.add(self, other)
    def __radd__(self, other): return F.add(other, self)
    def __sub__(self, other): return F.sub(self, other)
    def __rsub__(self, other): return F.sub(other, self)
    def __mul__(self, other): return F.mul(self, other)
    def __rmul__(self, other): return F.mul(other, self)
    def __truediv__(self, other): return F.div(self, other)
    def __rtruediv__(self, other): return F.div(other, self)
    def __pow__(self, other): return F.pow(self, other)
    def __rpow__(self, other): return F.pow(other, self)
    def __matmul__(self, other): return F.matmul(self, other)
    def __rmatmul__(self, other): return F.matmul(other, self)
    def __neg__(self): return F.neg(self)
    def __abs__(self): return F.abs(self)
    def __getitem__(self, index): return F.getitem(self, index)

    # comparisons: not differentiable, return boolean tensors
    def _compare(self, other, op):
        other = other.data if isinstance(other, Tensor) else other
        with backend.on_device_of(self.data):
            return Tensor._wrap(op(self.data, other))

    def __lt__(self, other): return self._compare(other, lambda a, b: a < b)
    def __le__(self, other): return self._compare(other, lambda a, b: a <= b)
    def __gt__(self, other): return self._compare(other, lambda a, b: a > b)
    def __ge__(self, other): return self._compare(other, lambda a, b: a >= b)
    def __eq__(self, other): return self._compare(other, lambda a, b: a == b)
    def __ne__(self, other): return self._compare(other, lambda a, b: a != b)

    # ----- op methods (see tinygrad_caps.functional for the docs) -----
    def sum(self, axis=None, keepdims=False): return F.sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return F.mean(self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return F.max(self, axis, keepdims)
    def min(self, axis=None, keepdims=False): return F.min(self, axis, keepdims)
    def reshape(self, *shape): return F.reshape(self, shape[0] if len(shape) == 1 and not isinstance(shape[0], numbers.Integral) else shape)
    def flatten(self, start_axis=0): return F.flatten(self, start_axis)
    def transpose(self, *axes): return F.transpose(self, (axes[0] if len(axes) == 1 and not isinstance(axes[0], numbers.Integral) else axes) or None)
    def permute(self, *axes): return F.permute(self, axes[0] if len(axes) == 1 and not isinstance(axes[0], numbers.Integral) else axes)
    def expand_dims(self, axis): return F.expand_dims(self, axis)
    def squeeze(self, axis=None): return F.squeeze(self, axis)
    def broadcast_to(self, shape): return F.broadcast_to(self, shape)
    def exp(self): return F.exp(self)
    def log(self): return F.log(self)
    def sqrt(self): return F.sqrt(self)
    def abs(self): return F.abs(self)
    def clip(self, low=None, high=None): return F.clip(self, low, high)
    def relu(self): return F.relu(self)
    def sigmoid(self): return F.sigmoid(self)
    def tanh(self): return F.tanh(self)
    def softmax(self, axis=-1): return F.softmax(self, axis)
    def log_softmax(self, axis=-1): return F.log_softmax(self, axis)
    def matmul(self, other): return F.matmul(self, other)


class _HookHandle:
    def __init__(self, hooks, fn):
        self._hooks, self._fn = hooks, fn

    def remove(self):
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


def tensor(data, dtype=None, device=None, requires_grad=False) -> Tensor:
    """Create a leaf Tensor from a list, scalar, NumPy/CuPy array or Tensor (its values are copied).

    Python floats become the default float dtype (float32); NumPy arrays keep their dtype.
    ``device`` is ``"cpu"``, ``"cuda"`` or None for the default device (CuPy arrays stay on the GPU).
    """
    if isinstance(data, Tensor):
        data = data.data
    array = _as_array(data, dtype, device)
    # (a CuPy array never shares NumPy's memory; CuPy's shares_memory would refuse the NumPy operand)
    if array is data or (type(array) is np.ndarray and isinstance(data, np.ndarray) and np.shares_memory(array, data)):
        with backend.on_device_of(array):  # (CuPy's copy() lands on the current GPU)
            array = array.copy()
    return leaf(array, requires_grad)


def leaf(array, requires_grad=False) -> Tensor:
    """A leaf Tensor around ``array`` (NumPy or CuPy, no copy), on the device that holds it.
    (``Tensor(array)`` would send a NumPy array to the default device, a GPU where there is one.)"""
    out = Tensor._wrap(array)
    if requires_grad:
        out.requires_grad_(True)
    return out


_CATEGORY = {"b": 0, "i": 1, "u": 1, "f": 2, "c": 3}


def _scalar_dtype(value, like_dtype: np.dtype) -> np.dtype:
    """The dtype a Python number takes beside a tensor of ``like_dtype`` (PyTorch: numbers are weak)."""
    kind = like_dtype.kind
    if isinstance(value, bool):
        return like_dtype
    if isinstance(value, numbers.Integral):
        return like_dtype if kind != "b" else np.dtype(np.int64)
    if isinstance(value, numbers.Real):
        return like_dtype if kind in "fc" else _default_float
    return like_dtype if kind == "c" else np.result_type(_default_float, np.complex64)


def zero_dim_dtype(dtype: np.dtype, like: "Tensor") -> np.dtype:
    """The dtype a zero-dimensional operand takes beside ``like`` (PyTorch's rule).

    Beside a tensor with dimensions, a zero-dimensional one (a NumPy scalar, a 0-d array or
    Tensor) of the same or a lower category (bool < int < float < complex) takes that tensor's
    dtype: ``float32 tensor * np.float64(2)`` stays float32. Otherwise it keeps its own.
    """
    if like.ndim > 0 and _CATEGORY.get(dtype.kind, 9) <= _CATEGORY.get(like.dtype.kind, -1):
        return like.dtype
    return dtype


def as_tensor(value, like: Tensor | None = None) -> Tensor:
    """``value`` as a Tensor; beside ``like``, numbers and zero-dim values follow PyTorch's promotion.

    A Python number is weak: it takes ``like``'s dtype, or the default float dtype for a float
    beside an integer tensor (``tensor(int array) + 0.5`` is float32). A NumPy scalar or 0-d array
    beside a tensor with dimensions takes its dtype if its category is not higher. Tensors are
    returned as they are; arrays are wrapped without a copy.
    """
    if isinstance(value, Tensor):
        return value
    if like is not None:
        if like.xp is np:
            return _beside(value, like, np)
        if isinstance(value, np.ndarray) and value.ndim > 0:
            raise backend.DeviceError(
                f"operands are on different devices: cpu (a NumPy array) and {like.device}; move them with .to(device) first"
            )
        with backend.on_device_of(like.data):  # beside a tensor on another GPU than the current one
            return _beside(value, like, like.xp)
    if isinstance(value, np.ndarray) or backend.is_cupy_array(value):
        return Tensor._wrap(value)
    return Tensor(value)


def _beside(value, like: Tensor, xp) -> Tensor:
    """``value`` (a number, NumPy scalar or 0-d array, or array-like) as a Tensor of ``xp`` next to ``like``."""
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return Tensor._wrap(_zero_dim(xp, value, zero_dim_dtype(value.dtype, like)))
    if isinstance(value, numbers.Number):
        return Tensor._wrap(_zero_dim(xp, value, _scalar_dtype(value, like.dtype)))
    return Tensor._wrap(xp.asarray(value))


def _zero_dim(xp, value, dtype):
    """A new 0-d array of ``dtype`` holding ``value``; on a GPU it is filled there by a kernel,
    ordered on the stream like the ops around it, instead of copied from the host (every
    ``x * 0.5`` or ``1 + x`` of a step makes one)."""
    if xp is np:
        return np.asarray(value, dtype=dtype)
    return xp.full((), value.item() if isinstance(value, (np.generic, np.ndarray)) else value, dtype=dtype)


from . import functional as F  # noqa: E402  (functional builds on Tensor)
