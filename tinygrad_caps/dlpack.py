"""Zero-copy exchange with any library that speaks DLPack (PyTorch, JAX, CuPy, NumPy).

    t = tc.from_dlpack(torch_tensor)        # shares torch_tensor's memory (CPU or the same GPU)
    x = torch.from_dlpack(t)                # shares t's memory; t.__dlpack__ is what torch calls

The data is shared, never copied, where the two sides live on the same device: a write on either
side is seen on the other. Strides and dtypes are kept (a transposed PyTorch tensor arrives as a
transposed view). What DLPack cannot express is refused or copied as the protocol says: a
producer that cannot export raises its BufferError, and ``copy=True`` asks for a copy instead. A
read-only NumPy array arrives read-only here; PyTorch's ``from_dlpack`` ignores that flag (it does
so for the NumPy array itself too), so a tensor over read-only memory handed to PyTorch is writable
there. A tensor made from another library's memory is a leaf; ``requires_grad=True`` makes it one
that gradients reach (the other library does not see them). ``from_dlpack`` of one of our own
Tensors shares its version counter, as ``detach`` does, so an in-place change through either is
caught by a backward that saved the other; a change made by another library is not.
"""
from __future__ import annotations

import numpy as np

from .tensor import Tensor, leaf

# DLPack's DLDeviceType codes (dlpack.h)
CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13
DEVICE_NAMES = {CPU: "cpu", CUDA: "cuda", CUDA_HOST: "cuda_host", CUDA_MANAGED: "cuda_managed"}
# the dtypes NumPy and CuPy take through DLPack (bfloat16, float8 and the like have no array type there)
ACCEPTED_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                   "float32", "float64", "complex64", "complex128")


def from_dlpack(obj, requires_grad: bool = False, copy: bool | None = None) -> Tensor:
    """A Tensor over the memory of ``obj`` (anything with ``__dlpack__`` and ``__dlpack_device__``).

    Args:
        obj: a NumPy or CuPy array, a PyTorch tensor, a JAX array, a tinygrad_caps Tensor, ...
        requires_grad: make the result a leaf that gradients reach.
        copy: None shares the memory; True copies it (for a producer that cannot share, or to
            detach from the other library).
    Returns:
        A Tensor on "cpu" (device type CPU, or CUDA host memory) or "cuda:N" (device type CUDA)
        with the producer's dtype, shape and strides. Raises TypeError for an object that speaks
        no DLPack or whose dtype NumPy/CuPy cannot hold (bfloat16...), ValueError for a device type
        tinygrad_caps has no arrays for.
    """
    if isinstance(obj, Tensor):
        if copy:
            return leaf(obj.data.copy(), requires_grad=requires_grad)
        shared = leaf(obj.data, requires_grad=requires_grad)
        shared._vc = obj._shared_version_counter()
        return shared
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise TypeError(f"from_dlpack: {type(obj).__name__} has no __dlpack__ and __dlpack_device__ "
                        "(a raw DLPack capsule is not accepted: pass the array or tensor that made it)")
    device_type, device_id = (int(v) for v in obj.__dlpack_device__())
    if device_type not in (CPU, CUDA_HOST, CUDA):
        name = DEVICE_NAMES.get(device_type, f"device type {device_type}")
        raise ValueError(f"from_dlpack: the data lives on {name} (id {device_id}); tinygrad_caps holds CPU and "
                         "CUDA arrays")
    try:
        array = _numpy_from_dlpack(obj, copy) if device_type != CUDA else _cupy_from_dlpack(obj, device_id, copy)
    except (RuntimeError, TypeError) as exc:
        if "dtype" not in str(exc).lower():
            raise
        raise TypeError(f"from_dlpack: the data's dtype {_dtype_name(obj)} has no NumPy/CuPy array type; accepted "
                        f"dtypes: {', '.join(ACCEPTED_DTYPES)} (convert it first, e.g. torch's .float())") from exc
    return leaf(array, requires_grad=requires_grad)


def _dtype_name(obj) -> str:
    """The producer's name for its dtype ("bfloat16" for torch.bfloat16), or "unknown" without one."""
    dtype = getattr(obj, "dtype", None)
    return "unknown" if dtype is None else str(dtype).removeprefix("torch.")


def _cupy_from_dlpack(obj, device_id, copy):
    """A CuPy array on GPU ``device_id`` over ``obj``'s memory (a copy when ``copy``)."""
    import cupy

    with cupy.cuda.Device(device_id):
        array = cupy.from_dlpack(obj)
        return array.copy() if copy else array


def _numpy_from_dlpack(obj, copy):
    """A NumPy array over ``obj``'s memory (a copy when ``copy``), also from pre-1.0 producers."""
    if copy is None:
        return np.from_dlpack(obj)
    try:
        return np.from_dlpack(obj, copy=copy)
    except TypeError:  # a producer that predates DLPack 1.0's copy argument
        array = np.from_dlpack(obj)
        return array.copy() if copy else array
