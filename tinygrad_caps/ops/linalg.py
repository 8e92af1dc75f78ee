"""Matrix products: matmul (batched, broadcasting) and linear, and the precision of GPU products."""
from __future__ import annotations

import numpy as np

from ..autograd.function import Function
from ..backend import array_module
from ..errors import ShapeError
from ..kernels import gemm
from ..tensor import Tensor, as_tensor
from ._common import Bilinear, operands, sum_to
from .shape import reshape, swapaxes, transpose

# The matmul precisions set_matmul_precision takes ("highest", "high"): the same tuple as kernels.gemm's,
# named here so that the layers above the engine read it without reaching past it into the kernels.
PRECISIONS = gemm.PRECISIONS


def set_matmul_precision(precision: str) -> None:
    """How GPU matrix products (``matmul``, ``linear``, convolutions) compute in float32:
    "highest" (the default) in float32; "high" with TF32 tensor cores (float32 accumulation,
    10-bit mantissa inputs), PyTorch's default for cuDNN convolutions on Ampere and Hopper. The
    CPU always computes in the operands' dtype; float64 is never affected."""
    gemm.set_precision(precision)


def get_matmul_precision() -> str:
    """"highest" or "high": what ``set_matmul_precision`` chose."""
    return gemm.get_precision()


def array_matmul(a, b):
    """``a @ b`` of raw arrays: NumPy's on the CPU; on the GPU cuBLAS through ``kernels.gemm`` (which
    a CUDA graph can capture, and which follows the matmul precision), or CuPy's for the shapes it
    does not take (broadcast batches, integer dtypes)."""
    if type(a) is np.ndarray:
        return np.matmul(a, b)
    if gemm.supports(a, b):
        return gemm.matmul(a, b)
    return array_module(a).matmul(a, b)


class MatMul(Bilinear):
    """a @ b for a, b with at least 2 dimensions; leading axes broadcast."""

    def forward(self, a, b):
        return array_matmul(a, b)

    def backward(self, gy):
        a, b = self.inputs
        ga = sum_to(matmul(gy, swapaxes(b, -1, -2)), a.shape) if self.needs_grad[0] else None
        gb = sum_to(matmul(swapaxes(a, -1, -2), gy), b.shape) if self.needs_grad[1] else None
        return ga, gb


def matmul(a, b) -> Tensor:
    """Matrix product with NumPy semantics: (..., n, k) @ (..., k, m) -> (..., n, m).

    1-D operands are treated as a row (left) or column (right) vector and that axis is dropped
    from the result. Leading (batch) axes broadcast.
    """
    a, b = operands(a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: operands must have at least 1 dimension, got shapes {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} do not align (inner sizes differ)")
    if a.ndim == 1 or b.ndim == 1:
        a2 = reshape(a, (1,) + a.shape) if a.ndim == 1 else a
        b2 = reshape(b, b.shape + (1,)) if b.ndim == 1 else b
        y = MatMul()(a2, b2)
        shape = y.shape[:-2] + (() if a.ndim == 1 else y.shape[-2:-1]) + (() if b.ndim == 1 else y.shape[-1:])
        return reshape(y, shape)
    return MatMul()(a, b)


def linear(x, weight, bias=None) -> Tensor:
    """x @ weight.T + bias: x (..., in), weight (out, in) as in PyTorch, bias (out,); returns (..., out)."""
    x, weight = as_tensor(x), as_tensor(weight)
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(f"linear: input of shape {x.shape} does not fit weight of shape {weight.shape} (out, in)")
    y = matmul(x, transpose(weight))
    if bias is not None:
        bias = as_tensor(bias)
        if bias.shape != (weight.shape[0],):
            raise ShapeError(f"linear: bias of shape {bias.shape} does not fit weight of shape {weight.shape}")
        y = y + bias
    return y
