"""NumPy versions of what each kernel computes: the oracles of the emulation's self-check, the GPU
self-test and the kernel tests."""
from __future__ import annotations

import numpy as np


def reference_squash(x, eps):
    """squash over the last axis in NumPy: |x|^2 / (1 + |x|^2) * x / sqrt(|x|^2 + eps)."""
    norm2 = (x * x).sum(-1, keepdims=True)
    return x * (norm2 / (1 + norm2) / np.sqrt(norm2 + eps))


def reference_squash_grad(x, g, eps):
    """The adjoint of squash at x applied to g, from the chain rule through its primitives."""
    norm2 = (x * x).sum(-1, keepdims=True)
    root = np.sqrt(norm2 + eps)
    scale = norm2 / (1 + norm2) / root
    d_scale = 1 / ((1 + norm2) ** 2 * root) - norm2 / ((1 + norm2) * 2 * root ** 3)  # d scale / d norm2
    return g * scale + 2 * x * d_scale * (g * x).sum(-1, keepdims=True)


def reference_softmax(x):
    """softmax over the last axis in NumPy."""
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def reference_softmax_grad(y, g):
    """The adjoint of softmax from its output y, applied to g: y (g - sum(g y)) over the last axis."""
    return y * (g - (g * y).sum(-1, keepdims=True))


def reference_adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, betas, eps, weight_decay, decoupled):
    """One Adam step in NumPy (PyTorch's formula): new (param, exp_avg, exp_avg_sq, max_exp_avg_sq or None)."""
    beta1, beta2 = betas
    if decoupled:
        param = param * (1 - lr * weight_decay)
    elif weight_decay:
        grad = grad + weight_decay * param
    exp_avg = exp_avg * beta1 + grad * (1 - beta1)
    exp_avg_sq = exp_avg_sq * beta2 + grad * grad * (1 - beta2)
    second = exp_avg_sq
    if max_exp_avg_sq is not None:
        second = max_exp_avg_sq = np.maximum(max_exp_avg_sq, exp_avg_sq)
    denom = np.sqrt(second) / np.sqrt(1 - beta2 ** step) + eps
    return param - lr / (1 - beta1 ** step) * exp_avg / denom, exp_avg, exp_avg_sq, max_exp_avg_sq


def reference_routing(u_hat, iterations, eps):
    """NumPy dynamic routing in float64 (the oracle of ``routing_forward``): (v, c, logits) of the last iteration."""
    x = u_hat.astype(np.float64)
    logits = np.zeros(x.shape[:3])
    for it in range(iterations):
        c = reference_softmax(logits)  # over J, the last axis
        v = reference_squash(np.einsum("bij,bijd->bjd", c, x), eps)
        if it + 1 < iterations:
            logits = logits + np.einsum("bijd,bjd->bij", x, v)
    return v, c, logits


def reference_col2im(col, image_shape, kernel, stride, padding, batch_last):
    """A loop-based col2im (the adjoint of ``reference_im2col``): sums each column entry into its pixel."""
    n, c, h, w = image_shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    patches = col.reshape(c, kh, kw, oh, ow, n) if batch_last else col.reshape(c, kh, kw, n, oh, ow)
    if batch_last:
        patches = patches.transpose(0, 1, 2, 5, 3, 4)
    padded = np.zeros((n, c, h + 2 * ph, w + 2 * pw), np.float64)
    for ky in range(kh):
        for kx in range(kw):
            padded[:, :, ky:ky + sh * oh:sh, kx:kx + sw * ow:sw] += patches[:, ky, kx].transpose(1, 0, 2, 3)
    return padded[:, :, ph:ph + h, pw:pw + w]


def reference_im2col(x, kernel, stride, padding, batch_last):
    """A loop-based im2col (the test oracle): rows (c, ky, kx), columns (oy, ox, n) or (n, oy, ox)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    col = np.zeros((c, kh, kw, n, oh, ow), x.dtype)
    for ky in range(kh):
        for kx in range(kw):
            col[:, ky, kx] = padded[:, :, ky:ky + sh * oh:sh, kx:kx + sw * ow:sw].transpose(1, 0, 2, 3)
    if batch_last:
        col = col.transpose(0, 1, 2, 4, 5, 3)
    return col.reshape(c * kh * kw, n * oh * ow)
