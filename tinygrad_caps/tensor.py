"""The Tensor: an array (NumPy or CuPy) plus what reverse-mode autodiff needs to know about it."""
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
        "cuda" if backend.is_cupy_array(data) else backend.default_device()
    )
    xp = backend.module_for(target)
    if dtype is not None:
        dtype = np.dtype(dtype)
    elif not is_array and not isinstance(data, np.generic):
        probe = np.asarray(data)
        dtype = _default_float if probe.dtype == np.float64 else probe.dtype
    if target == "cuda" or backend.is_cupy_array(data):
        data = backend.to_device(data, target)
    return xp.asarray(data, dtype=dtype)


class Tensor:
    """An n-dimensional array that records the ops applied to it, for reverse-mode differentiation.

    Attributes:
        data: the NumPy (CPU) or CuPy (CUDA) array holding the values.
        grad: a Tensor with the accumulated gradient, or None.
        requires_grad: whether ops on this tensor are recorded.
        creator: the Function that produced it (None for a leaf).
    """

    __slots__ = ("data", "grad", "requires_grad", "creator", "_hooks", "_retains_grad", "__weakref__")
    __array_ufunc__ = None  # make NumPy defer to our reflected operators: ndarray * Tensor -> Tensor

    def __init__(self, data, dtype=None, device=None, requires_grad=False):
        self.data = _as_array(data, dtype, device)
        self.grad = None
        self.creator = None
        self._hooks = None
        self._retains_grad = False
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _wrap(cls, array):
        """A leaf-like Tensor around ``array`` with no copy and no checks (the ops' fast path)."""
        t = object.__new__(Tensor)
        t.data, t.grad, t.creator, t._hooks, t._retains_grad, t.requires_grad = array, None, None, None, False, False
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
        """A new leaf sharing this tensor's data, with no graph and no gradient."""
        return Tensor._wrap(self.data)

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
        self._hooks.append(fn)
        return _HookHandle(self._hooks, fn)

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
    if array is data or (isinstance(data, np.ndarray) and np.shares_memory(array, data)):
        array = array.copy()
    return Tensor(array, requires_grad=requires_grad)


def as_tensor(value, like: Tensor | None = None) -> Tensor:
    """``value`` as a Tensor; a Python scalar takes the dtype and device of ``like`` (NumPy 2 promotion).

    Tensors are returned as they are; arrays are wrapped without a copy.
    """
    if isinstance(value, Tensor):
        return value
    if like is not None:
        xp = like.xp
        if isinstance(value, np.generic):  # NumPy scalars carry their dtype (strong, as in NumPy 2)
            return Tensor._wrap(xp.asarray(value))
        if isinstance(value, numbers.Number):  # Python scalars are weak: they take like's dtype
            dtype = like.dtype if like.dtype.kind in "fc" else np.result_type(like.dtype, value)
            return Tensor._wrap(xp.asarray(value, dtype=dtype))
        if isinstance(value, np.ndarray) and xp is not np:
            raise backend.DeviceError(
                f"operands are on different devices: cpu (a NumPy array) and {like.device}; move them with .to(device) first"
            )
        return Tensor._wrap(xp.asarray(value))
    if isinstance(value, np.ndarray) or backend.is_cupy_array(value):
        return Tensor._wrap(value)
    return Tensor(value)


from . import functional as F  # noqa: E402  (functional builds on Tensor)
