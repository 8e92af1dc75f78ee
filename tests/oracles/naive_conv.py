"""Convolutions by loops in float64: the oracle of the engine's convolution ops (engine/test_conv.py),
of the im2col/col2im kernels on the emulation (kernels/test_emulation_asymmetric_conv.py) and of
PrimaryCaps (models/test_capsnet_layers.py)."""
import numpy as np

from tinygrad_caps.ops.conv import batch_last


def naive_conv2d(x, w, b, stride, padding):
    """Cross-correlation by loops in float64; stride and padding are (h, w) pairs."""
    (sh, sw), (ph, pw) = stride, padding
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    y = np.zeros((n, o, oh, ow))
    for i in range(n):
        for j in range(o):
            for r in range(oh):
                for s in range(ow):
                    patch = xp[i, :, r * sh:r * sh + kh, s * sw:s * sw + kw]
                    y[i, j, r, s] = (patch * w[j]).sum() + (b[j] if b is not None else 0.0)
    return y


def naive_conv_transpose2d(x, w, b, stride, padding, output_padding):
    """Scatter of every input pixel times the kernel, then the crop; all arguments are (h, w) pairs."""
    (sh, sw), (ph, pw), (eh, ew) = stride, padding, output_padding
    n, cin, h, wd = x.shape
    _, cout, kh, kw = w.shape
    oh = (h - 1) * sh - 2 * ph + kh + eh
    ow = (wd - 1) * sw - 2 * pw + kw + ew
    full = np.zeros((n, cout, oh + 2 * ph + kh, ow + 2 * pw + kw))
    for i in range(n):
        for ci in range(cin):
            for r in range(h):
                for s in range(wd):
                    full[i, :, r * sh:r * sh + kh, s * sw:s * sw + kw] += x[i, ci, r, s] * w[ci]
    y = full[:, :, ph:ph + oh, pw:pw + ow]
    return y + (b[None, :, None, None] if b is not None else 0.0)


def naive_patches(x, kernel, stride, padding):
    """(N, C, H, W) -> (C, kh, kw, N, OH, OW) by loops: patches[c, ky, kx, n, oy, ox]."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    out = np.zeros((c, kh, kw, n, oh, ow))
    for ky in range(kh):
        for kx in range(kw):
            for oy in range(oh):
                for ox in range(ow):
                    out[:, ky, kx, :, oy, ox] = xp[:, :, oy * sh + ky, ox * sw + kx].T
    return out


def naive_im2col(x, kernel, stride, padding, columns_batch_last=None):
    """The column matrix in the engine's documented order: (oy, ox, n) columns when batch_last, else (n, oy, ox).

    ``columns_batch_last``: that order (default: the engine's choice for this batch on NumPy)."""
    p = naive_patches(x, kernel, stride, padding)
    if batch_last(x.shape[0]) if columns_batch_last is None else columns_batch_last:
        p = p.transpose(0, 1, 2, 4, 5, 3)
    return p.reshape(p.shape[0] * p.shape[1] * p.shape[2], -1)


def naive_col2im(col, image_shape, kernel, stride, padding, columns_batch_last=None):
    """Adds every column entry back into its pixel, by loops (the adjoint of naive_im2col)."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    n, c, h, wd = image_shape
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    if batch_last(n) if columns_batch_last is None else columns_batch_last:
        p = col.reshape(c, kh, kw, oh, ow, n).transpose(0, 1, 2, 5, 3, 4)
    else:
        p = col.reshape(c, kh, kw, n, oh, ow)
    out = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    for ky in range(kh):
        for kx in range(kw):
            for oy in range(oh):
                for ox in range(ow):
                    out[:, :, oy * sh + ky, ox * sw + kx] += p[:, ky, kx, :, oy, ox].T
    return out[:, :, ph:ph + h, pw:pw + wd]
