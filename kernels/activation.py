"""Launchers for activation.cu: squash and softmax over the last axis, and their adjoints.

Shapes: x, y, g and the gradients share one shape (..., N); each row of N values is one capsule
(squash) or one distribution (softmax).
"""
from __future__ import annotations

from .launch import DEFAULT_THREADS, KernelLaunch, check_int32, default_runner, empty_like_output, grid_for, i32, \
    prepare, suffix


def _rows(op, named_arrays):
    """The arrays C-contiguous on their device, the output and (rows, N); checks they share a shape."""
    first_name, first = next(iter(named_arrays.items()))
    ndims = {name: first.ndim for name in named_arrays}
    if first.ndim == 0:
        raise ValueError(f"{op}: {first_name} must have at least one axis, got a scalar")
    xp, arrays = prepare(op, named_arrays, ndims)
    for name, a in zip(named_arrays, arrays):
        if a.shape != first.shape:
            raise ValueError(f"{op}: {name} of shape {tuple(a.shape)} differs from {first_name} of shape {tuple(first.shape)}")
    n = first.shape[-1]
    rows = first.size // n if n else 0
    check_int32(op, rows=rows, N=n)
    out = empty_like_output(xp, first.shape, first.dtype, like=arrays[0])
    return arrays, out, rows, n


def _launch(kernel, arrays, out, rows, n, extra, runner, threads):
    if out.size == 0:
        return out
    runner = runner or default_runner(arrays)
    runner(KernelLaunch("activation.cu", f"{kernel}_{suffix(out.dtype)}", grid_for(rows, threads, runner), (threads,),
                        (*arrays, out) + i32(rows, n) + extra, outputs=(len(arrays),)))
    return out


def squash_rows(x, eps: float = 1e-8, runner=None, threads: int = DEFAULT_THREADS):
    """|x|^2 / (1 + |x|^2) * x / sqrt(|x|^2 + eps) over the last axis: x (..., N) -> same shape."""
    (x,), out, rows, n = _rows("squash_rows", {"x": x})
    return _launch("squash_rows", (x,), out, rows, n, (x.dtype.type(eps),), runner, threads)


def squash_rows_grad(x, g, eps: float = 1e-8, runner=None, threads: int = DEFAULT_THREADS):
    """The adjoint of ``squash_rows`` at x applied to g: x, g (..., N) -> dL/dx (..., N)."""
    (x, g), out, rows, n = _rows("squash_rows_grad", {"x": x, "g": g})
    return _launch("squash_rows_grad", (x, g), out, rows, n, (x.dtype.type(eps),), runner, threads)


def softmax_rows(x, runner=None, threads: int = DEFAULT_THREADS):
    """exp(x - max) / sum exp(x - max) over the last axis: x (..., N) -> same shape (N >= 1)."""
    (x,), out, rows, n = _rows("softmax_rows", {"x": x})
    return _launch("softmax_rows", (x,), out, rows, n, (), runner, threads)


def softmax_rows_grad(y, g, runner=None, threads: int = DEFAULT_THREADS):
    """The adjoint of softmax from its output y: y, g (..., N) -> y (g - sum(g y)) (..., N)."""
    (y, g), out, rows, n = _rows("softmax_rows_grad", {"y": y, "g": g})
    return _launch("softmax_rows_grad", (y, g), out, rows, n, (), runner, threads)
