"""Matrix products of CuPy arrays through cuBLAS, called through ctypes, so that they can be
recorded in a CUDA graph: CuPy refuses every cuBLAS call, its raw bindings included, while a stream
captures (``NotImplementedError: calling cuBLAS API during stream capture``), although cuBLAS
itself supports capture. Deals in arrays only.

``matmul(a, b)``: (n, k) @ (k, m) -> (n, m), and batched (B, n, k) @ (B, k, m) -> (B, n, m), for
float32 and float64 arrays on one GPU. Operands may be C-contiguous or transposed views of
C-contiguous arrays (read through cuBLAS's transpose flags, no copy); other strides are copied
first. The product is written into a new C-contiguous array, or into ``out``.

Precision (``set_precision``): "highest" computes in the operands' dtype; "high" lets float32
products use TF32 tensor cores (10-bit mantissa inputs, float32 accumulation), as PyTorch does for
cuDNN convolutions by default on Ampere and Hopper.

Each GPU gets one cuBLAS handle with a workspace of its own (``WORKSPACE_BYTES``), set before
every call together with the current stream, so cuBLAS never allocates during a capture. The
tests' CPU stand-in for CuPy provides ``cupy.cuda.standin_cublas`` in place of the library.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

PRECISIONS = ("highest", "high")
WORKSPACE_BYTES = 32 << 20
LIBRARY_NAMES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so", "cublas64_13.dll", "cublas64_12.dll")


def _library_names() -> tuple:
    """LIBRARY_NAMES with CuPy's own CUDA major version first, so that dlopen returns the cuBLAS
    CuPy has loaded already rather than a second one."""
    try:
        import cupy

        major = cupy.cuda.runtime.runtimeGetVersion() // 1000
    except Exception:  # noqa: BLE001  (no runtime to ask: the fixed order)
        return LIBRARY_NAMES
    own = tuple(name for name in LIBRARY_NAMES if f".{major}" in name or f"_{major}." in name)
    return own + tuple(name for name in LIBRARY_NAMES if name not in own)


# cublas_api.h and library_types.h
_OP_N, _OP_T = 0, 1
_R_32F, _R_64F = 0, 1
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70
_GEMM_DEFAULT = -1

_precision = "highest"


def set_precision(precision: str) -> None:
    """"highest" (products in the operands' dtype) or "high" (TF32 tensor cores for float32)."""
    global _precision
    if precision not in PRECISIONS:
        raise ValueError(f"matmul precision must be one of {PRECISIONS}, got {precision!r}")
    _precision = precision


def get_precision() -> str:
    """The precision ``set_precision`` chose ("highest" by default)."""
    return _precision


def supports(a, b) -> bool:
    """Whether ``matmul`` takes these operands: 2-D, or 3-D with one batch size, one float dtype."""
    return (a.ndim == b.ndim and a.ndim in (2, 3) and a.dtype == b.dtype and a.dtype in (np.float32, np.float64)
            and (a.ndim == 2 or a.shape[0] == b.shape[0]))


def matmul(a, b, out=None):
    """``a @ b`` for CuPy arrays (see the module docstring); returns ``out`` or a new array."""
    import cupy

    if not supports(a, b):
        raise ValueError(f"gemm.matmul: takes 2-D or equally batched 3-D float32/float64 operands, got "
                         f"{a.dtype} {tuple(a.shape)} and {b.dtype} {tuple(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"gemm.matmul: inner sizes differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    shape = a.shape[:-1] + b.shape[-1:]
    if out is None:
        out = cupy.empty(shape, dtype=a.dtype)
    elif out.shape != shape or out.dtype != a.dtype or not out.flags.c_contiguous:
        raise ValueError(f"gemm.matmul: out must be C-contiguous {a.dtype} {shape}, got {out.dtype} {tuple(out.shape)}")
    if out.size == 0:
        return out
    if a.shape[-1] == 0:
        out.fill(0)
        return out
    standin = getattr(cupy.cuda, "standin_cublas", None)
    if standin is not None:
        standin.matmul(a, b, out, _precision, workspace=workspace(cupy))
        return out
    a_layout, b_layout = _layout(cupy, a), _layout(cupy, b)
    _Cublas.for_current_device().gemm(a_layout, b_layout, out)
    return out


_workspaces = {}  # GPU index -> the workspace every cuBLAS call on it is given
_workspace_lock = threading.Lock()


def workspace(cupy):
    """The current GPU's cuBLAS workspace (WORKSPACE_BYTES), made at its first product and kept for the
    process: a captured graph's products use it at every replay, so it never goes back to the device."""
    device = cupy.cuda.Device().id
    with _workspace_lock:
        if device not in _workspaces:
            _workspaces[device] = cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)
        return _workspaces[device]


def _layout(cupy, x):
    """(array, transposed, leading dimension, batch stride) describing ``x`` to cuBLAS, copying it
    first when its strides fit neither layout."""
    item = x.itemsize
    rows, cols = x.shape[-2:]
    strides = x.strides[-2:]
    batch_ok = x.ndim == 2 or x.strides[0] % item == 0
    if batch_ok and strides[1] == item and strides[0] % item == 0 and strides[0] // item >= max(cols, 1):
        return x, False, strides[0] // item, (x.strides[0] // item if x.ndim == 3 else 0)
    if batch_ok and strides[0] == item and strides[1] % item == 0 and strides[1] // item >= max(rows, 1):
        return x, True, strides[1] // item, (x.strides[0] // item if x.ndim == 3 else 0)
    x = cupy.ascontiguousarray(x)
    return x, False, max(cols, 1), (rows * cols if x.ndim == 3 else 0)


class _Cublas:
    """One cuBLAS handle and workspace per GPU, through ctypes."""

    _lock = threading.Lock()
    _per_device = {}
    _lib = None

    @classmethod
    def for_current_device(cls) -> "_Cublas":
        import cupy

        device = cupy.cuda.Device().id
        with cls._lock:
            if device not in cls._per_device:
                cls._per_device[device] = cls(cupy)
            return cls._per_device[device]

    @classmethod
    def _library(cls):
        if cls._lib is None:
            from cupy_backends.cuda.libs import cublas  # noqa: F401  (loads CuPy's own libcublas first)

            errors = []
            for name in _library_names():
                try:
                    cls._lib = ctypes.CDLL(name)
                    break
                except OSError as exc:
                    errors.append(str(exc))
            else:
                raise RuntimeError("cuBLAS could not be loaded through ctypes: " + "; ".join(errors))
        return cls._lib

    def __init__(self, cupy):
        self.lib = self._library()
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self.workspace = workspace(cupy)
        self.one = {np.dtype(np.float32): ctypes.c_float(1.0), np.dtype(np.float64): ctypes.c_double(1.0)}
        self.zero = {np.dtype(np.float32): ctypes.c_float(0.0), np.dtype(np.float64): ctypes.c_double(0.0)}

    def gemm(self, a_layout, b_layout, out):
        """out = a @ b (row-major) as the column-major product out^T = b^T a^T."""
        import cupy

        a, a_t, lda, stride_a = a_layout
        b, b_t, ldb, stride_b = b_layout
        n, k = a.shape[-2:]
        m = b.shape[-1]
        stream = cupy.cuda.get_current_stream().ptr
        _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream)), "cublasSetStream")
        _check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(self.workspace.data.ptr),
                                              ctypes.c_size_t(WORKSPACE_BYTES)), "cublasSetWorkspace")
        dtype = np.dtype(out.dtype)
        data_type = _R_32F if dtype == np.float32 else _R_64F
        if dtype == np.float64:
            compute = _COMPUTE_64F
        else:
            compute = _COMPUTE_32F_FAST_TF32 if _precision == "high" else _COMPUTE_32F
        one, zero = self.one[dtype], self.zero[dtype]
        args = (self.handle, _OP_T if b_t else _OP_N, _OP_T if a_t else _OP_N, m, n, k, ctypes.byref(one),
                ctypes.c_void_p(b.data.ptr), data_type, ldb)
        if out.ndim == 2:
            status = self.lib.cublasGemmEx(*args, ctypes.c_void_p(a.data.ptr), data_type, lda, ctypes.byref(zero),
                                           ctypes.c_void_p(out.data.ptr), data_type, m, compute, _GEMM_DEFAULT)
        else:
            status = self.lib.cublasGemmStridedBatchedEx(
                *args, ctypes.c_longlong(stride_b), ctypes.c_void_p(a.data.ptr), data_type, lda,
                ctypes.c_longlong(stride_a), ctypes.byref(zero), ctypes.c_void_p(out.data.ptr), data_type, m,
                ctypes.c_longlong(n * m), out.shape[0], compute, _GEMM_DEFAULT)
        _check(status, "cublasGemmEx")


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} failed with cuBLAS status {status}")
