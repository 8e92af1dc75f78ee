"""2-D convolution by im2col + one GEMM, and its adjoint, the transposed convolution.

Layout: NCHW images, weights (out, in, kh, kw) for conv2d and (in, out, kh, kw) for
conv_transpose2d (PyTorch's). The column matrix is (C*kh*kw, N*OH*OW), so the whole batch is one
matrix product with the (O, C*kh*kw) weight; its columns run over (oy, ox, n), batch innermost
(see ``batch_last``). ``Im2Col`` and ``Col2Im`` are each other's adjoint
and each other's backward, so every derivative of a convolution, of any order, is built from
im2col, col2im and matmul.
"""
from __future__ import annotations

import numpy as np

from ..autograd.function import Function
from ..backend import array_module
from ..kernels import conv as conv_kernels
from ..kernels import launch as kernel_launch
from ..errors import ShapeError
from ..tensor import Tensor, as_tensor
from ._common import Bilinear
from .._parallel import over_slices
from .linalg import array_matmul, matmul
from .shape import reshape, transpose


def _pair(value, name):
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or any(int(v) != v for v in pair):
        raise ValueError(f"conv: {name} must be an int or a pair of ints, got {value!r}")
    return int(pair[0]), int(pair[1])


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length of a convolution along one axis: (size + 2*padding - kernel) // stride + 1."""
    return (size + 2 * padding - kernel) // stride + 1


def batch_last(n: int, xp=np) -> bool:
    """Column order for a batch of ``n`` on NumPy: (oy, ox, n) when the batch is large, else (n, oy, ox).

    NumPy copies fast only along long inner runs. With the batch innermost, every im2col and col2im
    inner loop runs over N contiguous values (instead of OW strided ones), which made both faster at
    CapsNet's sizes; a tiny batch keeps the image row innermost instead. On the GPU the
    image row stays innermost, so neighbouring threads read neighbouring pixels.
    """
    return xp is np and n >= 8


def channels_first_axes(n: int, xp=np) -> tuple:
    """The permutation of NCHW that puts an image batch into column order: (C, H, W, N) or (C, N, H, W)."""
    return (1, 2, 3, 0) if batch_last(n, xp) else (1, 0, 2, 3)


def from_channels_first_axes(n: int, xp=np) -> tuple:
    """The inverse of ``channels_first_axes``: back to NCHW."""
    return (3, 0, 1, 2) if batch_last(n, xp) else (1, 0, 2, 3)


def _kernel_runner(array):
    """The kernel runner for ``array`` (None: the NumPy/CuPy formulation)."""
    return kernel_launch.kernel_runner_for(array)


def im2col_array(x, kernel, stride, padding):
    """(N, C, H, W) array -> (C*kh*kw, OH*OW*N) patch matrix (columns in ``batch_last`` order).

    Row index is (channel, ky, kx); column index is (oy, ox, n), or (n, oy, ox) for a small batch.
    """
    xp = array_module(x)
    n, c, h, w = x.shape
    runner = _kernel_runner(x)
    if runner is not None:
        return conv_kernels.im2col(x, kernel, stride, padding, batch_last(n, xp), runner=runner)
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    oh, ow = conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw)
    src = xp.ascontiguousarray(x.transpose(channels_first_axes(n, xp)))
    if ph or pw:
        shape = (c, h + 2 * ph, w + 2 * pw, n) if batch_last(n, xp) else (c, n, h + 2 * ph, w + 2 * pw)
        padded = xp.zeros(shape, dtype=x.dtype)
        if batch_last(n, xp):
            padded[:, ph:ph + h, pw:pw + w, :] = src
        else:
            padded[:, :, ph:ph + h, pw:pw + w] = src
        src = padded
    s = src.strides
    if batch_last(n, xp):
        shape, strides = (c, kh, kw, oh, ow, n), (s[0], s[1], s[2], s[1] * sh, s[2] * sw, s[3])
    else:
        shape, strides = (c, kh, kw, n, oh, ow), (s[0], s[2], s[3], s[1], s[2] * sh, s[3] * sw)
    windows = xp.lib.stride_tricks.as_strided(src, shape=shape, strides=strides)
    if xp is not np:
        return xp.ascontiguousarray(windows).reshape(c * kh * kw, n * oh * ow)
    col = np.empty(shape, dtype=x.dtype)

    def copy_channels(start, stop):
        col[start:stop] = windows[start:stop]

    over_slices(c, copy_channels, col.nbytes)
    return col.reshape(c * kh * kw, n * oh * ow)


def col2im_array(col, image_shape, kernel, stride, padding):
    """Adjoint of im2col: sums every patch entry back into its pixel; returns an (N, C, H, W) array.

    Deterministic: a fixed loop over the kh*kw kernel offsets, no atomics.
    """
    xp = array_module(col)
    n, c, h, w = image_shape
    runner = _kernel_runner(col)
    if runner is not None:
        return conv_kernels.col2im(col, image_shape, kernel, stride, padding, batch_last(n, xp), runner=runner)
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    oh, ow = conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw)
    hp, wp = h + 2 * ph, w + 2 * pw
    if batch_last(n, xp):
        return _col2im_batch_last(col, image_shape, kernel, stride, padding)
    else:
        patches = col.reshape(c, kh, kw, n, oh, ow)
        out = xp.zeros((c, n, hp, wp), dtype=col.dtype)
        for i in range(kh):
            for j in range(kw):
                out[:, :, i:i + sh * oh:sh, j:j + sw * ow:sw] += patches[:, i, j]
        out = out[:, :, ph:ph + h, pw:pw + w]
    return xp.ascontiguousarray(out.transpose(from_channels_first_axes(n, xp)))


def _col2im_batch_last(col, image_shape, kernel, stride, padding):
    """col2im for NumPy columns in (oy, ox, n) order: an NCHW view of a (C, H, W, N) array.

    Pixels are summed one stride phase at a time: the pixels (y, x) with y = p (mod sh) and
    x = q (mod sw) only receive patch entries of kernel offsets i = p (mod sh), j = q (mod sw),
    and inside one phase those land on a dense (oh, ow) block of it. So each addition runs over
    contiguous rows of ow * n values instead of n. Returning the (C, H, W, N) sum as a view, not an
    NCHW copy, keeps the layout for the elementwise ops after it (they keep their input's layout),
    so no transposing copy is made.
    """
    n, c, h, w = image_shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    oh, ow = conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw)
    hp, wp = h + 2 * ph, w + 2 * pw
    patches = col.reshape(c, kh, kw, oh, ow, n)
    strided = sh > 1 or sw > 1
    out = (np.empty if strided else np.zeros)((c, hp, wp, n), dtype=col.dtype)

    def add_channels(start, stop):  # channels are independent: each thread sums its own
        for p in range(sh):
            for q in range(sw):
                phase = out[start:stop] if not strided else np.zeros(
                    (stop - start, len(range(p, hp, sh)), len(range(q, wp, sw)), n), dtype=col.dtype)
                for i in range(p, kh, sh):
                    for j in range(q, kw, sw):
                        phase[:, i // sh:i // sh + oh, j // sw:j // sw + ow, :] += patches[start:stop, i, j]
                if strided:
                    out[start:stop, p::sh, q::sw, :] = phase

    over_slices(c, add_channels, col.nbytes)
    return out[:, ph:ph + h, pw:pw + w, :].transpose(3, 0, 1, 2)


class Im2Col(Function):
    save_inputs = ()

    def __init__(self, kernel, stride, padding):
        self.kernel, self.stride, self.padding = kernel, stride, padding

    def forward(self, x):
        return im2col_array(x, self.kernel, self.stride, self.padding)

    def backward(self, gy):
        return Col2Im(self.inputs[0].shape, self.kernel, self.stride, self.padding)(gy)


class Col2Im(Function):
    save_inputs = ()

    def __init__(self, image_shape, kernel, stride, padding):
        self.image_shape, self.kernel, self.stride, self.padding = tuple(image_shape), kernel, stride, padding

    def forward(self, col):
        return col2im_array(col, self.image_shape, self.kernel, self.stride, self.padding)

    def backward(self, gy):
        return Im2Col(self.kernel, self.stride, self.padding)(gy)


class Conv2d(Bilinear):
    """Cross-correlation without bias as one node: im2col and one GEMM.

    Bilinear in (image, weight): the node keeps the image (for the weight's gradient) and the
    weight (for the image's), never the column matrix: backward builds the columns again
    (PrimaryCaps at B=100: 298 MB of columns against a 41 MB image). Backward is written with Im2Col, MatMul and Col2Im, so it is
    differentiable again.
    """

    def __init__(self, kernel, stride, padding):
        self.kernel, self.stride, self.padding = kernel, stride, padding

    def forward(self, x, w):
        n, o = x.shape[0], w.shape[0]
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        oh, ow = conv_output_size(x.shape[2], kh, sh, ph), conv_output_size(x.shape[3], kw, sw, pw)
        xp = array_module(x)
        col = im2col_array(x, self.kernel, self.stride, self.padding)
        y = array_matmul(w.reshape(o, -1), col)
        grid = (o, oh, ow, n) if batch_last(n, xp) else (o, n, oh, ow)
        return y.reshape(grid).transpose(from_channels_first_axes(n, xp))

    def backward(self, gy):
        x, w = self.inputs
        n, o = x.shape[0], w.shape[0]
        xp = gy.xp
        rows = reshape(transpose(gy, channels_first_axes(n, xp)), (o, -1))  # (O, columns)
        gx = gw = None
        if self.needs_grad[0]:  # first, so its column-sized product is gone before the columns are rebuilt
            gx = Col2Im(x.shape, self.kernel, self.stride, self.padding)(matmul(transpose(reshape(w, (o, -1))), rows))
        if self.needs_grad[1]:
            col = Im2Col(self.kernel, self.stride, self.padding)(x)
            gw = reshape(matmul(rows, transpose(col)), w.shape)
        return gx, gw


def im2col(x, kernel_size, stride=1, padding=0) -> Tensor:
    """Differentiable im2col: x (N, C, H, W) -> (C*kh*kw, N*OH*OW)."""
    x = as_tensor(x)
    if x.ndim != 4:
        raise ShapeError(f"im2col: expected an (N, C, H, W) input, got shape {x.shape}")
    return Im2Col(_pair(kernel_size, "kernel_size"), _pair(stride, "stride"), _pair(padding, "padding"))(x)


def col2im(col, image_shape, kernel_size, stride=1, padding=0) -> Tensor:
    """Differentiable col2im (adjoint of im2col): (C*kh*kw, N*OH*OW) -> image_shape (N, C, H, W)."""
    return Col2Im(image_shape, _pair(kernel_size, "kernel_size"), _pair(stride, "stride"), _pair(padding, "padding"))(
        as_tensor(col)
    )


def _check_conv_args(op, x, w, b, in_axis, stride, padding):
    if x.ndim != 4 or w.ndim != 4:
        raise ShapeError(f"{op}: expected input (N, C, H, W) and a 4-D weight, got shapes {x.shape} and {w.shape}")
    if x.shape[1] != w.shape[in_axis]:
        raise ShapeError(
            f"{op}: input has {x.shape[1]} channels but the weight of shape {w.shape} expects {w.shape[in_axis]}"
        )
    out_channels = w.shape[1 - in_axis]
    if b is not None and b.shape != (out_channels,):
        raise ShapeError(f"{op}: bias of shape {b.shape} does not fit {out_channels} output channels")
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    if min(stride) < 1 or min(padding) < 0:
        raise ValueError(f"{op}: stride must be >= 1 and padding >= 0, got stride={stride}, padding={padding}")
    return stride, padding


def conv2d(x, w, b=None, stride=1, padding=0) -> Tensor:
    """2-D cross-correlation (PyTorch's conv2d) by im2col and one GEMM.

    Args:
        x: (N, C, H, W). w: (O, C, kh, kw). b: (O,) or None.
        stride, padding: int or (h, w) pair; zero padding.
    Returns:
        (N, O, OH, OW) with OH = (H + 2*padding - kh) // stride + 1 (likewise OW).
    """
    x, weight = as_tensor(x), as_tensor(w)
    bias = None if b is None else as_tensor(b)
    stride, padding = _check_conv_args("conv2d", x, weight, bias, 1, stride, padding)
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    oh, ow = conv_output_size(h, kh, stride[0], padding[0]), conv_output_size(w, kw, stride[1], padding[1])
    if oh < 1 or ow < 1:
        raise ShapeError(f"conv2d: kernel {(kh, kw)} is larger than the padded input {x.shape}")
    y = Conv2d((kh, kw), stride, padding)(x, weight)
    if bias is not None:
        y = y + reshape(bias, (1, o, 1, 1))
    return y


def conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0) -> Tensor:
    """Transposed convolution (PyTorch's conv_transpose2d): the adjoint of conv2d in its input.

    Args:
        x: (N, Cin, H, W). w: (Cin, Cout, kh, kw). b: (Cout,) or None.
        stride, padding, output_padding: int or (h, w) pair; output_padding < stride.
    Returns:
        (N, Cout, OH, OW) with OH = (H - 1)*stride - 2*padding + kh + output_padding.
    """
    x, weight = as_tensor(x), as_tensor(w)
    bias = None if b is None else as_tensor(b)
    stride, padding = _check_conv_args("conv_transpose2d", x, weight, bias, 0, stride, padding)
    extra = _pair(output_padding, "output_padding")
    if extra[0] >= stride[0] or extra[1] >= stride[1] or min(extra) < 0:
        raise ValueError(f"conv_transpose2d: output_padding {extra} must be >= 0 and smaller than stride {stride}")
    n, cin, h, w = x.shape
    _, cout, kh, kw = weight.shape
    oh = (h - 1) * stride[0] - 2 * padding[0] + kh + extra[0]
    ow = (w - 1) * stride[1] - 2 * padding[1] + kw + extra[1]
    if oh < 1 or ow < 1:
        raise ShapeError(f"conv_transpose2d: padding {padding} leaves no output for input {x.shape}")
    rows = reshape(transpose(x, channels_first_axes(n, x.xp)), (cin, n * h * w))
    col = matmul(transpose(reshape(weight, (cin, cout * kh * kw))), rows)
    y = Col2Im((n, cout, oh, ow), (kh, kw), stride, padding)(col)
    if bias is not None:
        y = y + reshape(bias, (1, cout, 1, 1))
    return y
