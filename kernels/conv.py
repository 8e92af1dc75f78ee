"""Launchers for im2col.cu: ``im2col`` and ``col2im`` on NCHW float32/float64 arrays."""
from __future__ import annotations

from .launch import DEFAULT_THREADS, KernelLaunch, check_int32, default_runner, empty_like_output, grid_for, i32, \
    prepare, suffix


def _output_size(size, kernel, stride, padding):
    return (size + 2 * padding - kernel) // stride + 1


def _geometry(op, image_shape, kernel, stride, padding):
    n, c, h, w = image_shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    if min(sh, sw) < 1 or min(ph, pw) < 0 or min(kh, kw) < 1:
        raise ValueError(f"{op}: invalid kernel {kernel}, stride {stride} or padding {padding}")
    oh, ow = _output_size(h, kh, sh, ph), _output_size(w, kw, sw, pw)
    if oh < 1 or ow < 1:
        raise ValueError(f"{op}: kernel {kernel} does not fit image {image_shape} with padding {padding}")
    check_int32(op, N=n, C=c, H=h, W=w)
    return n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow


def im2col(x, kernel, stride, padding, batch_last: bool, runner=None, threads: int = DEFAULT_THREADS):
    """x (N, C, H, W) -> col (C*kh*kw, N*OH*OW); columns (oy, ox, n) if ``batch_last`` else (n, oy, ox).

    ``kernel``, ``stride`` and ``padding`` are (h, w) pairs. Returns the new array.
    """
    xp, (x,) = prepare("im2col", {"x": x}, {"x": 4})
    geometry = _geometry("im2col", x.shape, kernel, stride, padding)
    n, c, _, _, kh, kw, _, _, _, _, oh, ow = geometry
    col = empty_like_output(xp, (c * kh * kw, n * oh * ow), x.dtype)
    launch = KernelLaunch("im2col.cu", f"im2col_{suffix(x.dtype)}", grid_for(col.size, threads), (threads,),
                          (x, col) + i32(*geometry, int(batch_last)), outputs=(1,))
    (runner or default_runner([x]))(launch)
    return col


def col2im(col, image_shape, kernel, stride, padding, batch_last: bool, runner=None, threads: int = DEFAULT_THREADS):
    """col (C*kh*kw, N*OH*OW) -> image (N, C, H, W): the adjoint of ``im2col``, summing overlaps.

    Gathers per output pixel in a fixed order: deterministic, no atomics. Returns the new array.
    """
    xp, (col,) = prepare("col2im", {"col": col}, {"col": 2})
    geometry = _geometry("col2im", tuple(image_shape), kernel, stride, padding)
    n, c, h, w, kh, kw, _, _, _, _, oh, ow = geometry
    if col.shape != (c * kh * kw, n * oh * ow):
        raise ValueError(f"col2im: col has shape {tuple(col.shape)}, expected {(c * kh * kw, n * oh * ow)} "
                         f"for image {tuple(image_shape)} and kernel {kernel}")
    x = empty_like_output(xp, (n, c, h, w), col.dtype)
    launch = KernelLaunch("im2col.cu", f"col2im_{suffix(col.dtype)}", grid_for(x.size, threads), (threads,),
                          (col, x) + i32(*geometry, int(batch_last)), outputs=(1,))
    (runner or default_runner([col]))(launch)
    return x
