"""Capsule contractions: the DigitCaps prediction and the two contractions of dynamic routing.

    capsule_predict:      u_hat[b,i,j,d] = sum_k W[i,j,d,k] u[b,i,k]
    routing_weighted_sum: s[b,j,d]       = sum_i c[b,i,j] u_hat[b,i,j,d]
    routing_agreement:    a[b,i,j]       = sum_d u_hat[b,i,j,d] v[b,j,d]

On NumPy arrays they run the fastest NumPy formulation we measured (batched matmul where it beats
einsum); on CuPy arrays our RawKernels (``tinygrad_caps.kernels``), or plain CuPy with
``kernels.use_raw_kernels(False)``. Each backward is written with these same ops (plus a
broadcast product), so derivatives of every order run on both devices: the prediction and its
two adjoints are closed under differentiation, and the weighted sum and the agreement are each
other's adjoints.
"""
from __future__ import annotations

import numpy as np

from ..autograd import Function
from ..backend import array_module, is_cupy_array
from ..errors import ShapeError
from ..kernels import capsule as capsule_kernels
from ..kernels import launch as kernel_launch
from ..kernels import routing as routing_kernels
from ..tensor import Tensor, as_tensor
from .shape import expand_dims


def _raw(array) -> bool:
    return is_cupy_array(array) and kernel_launch.raw_kernels_enabled()


def predict_array(u, W):
    """u (B,I,K), W (I,J,D,K) -> u_hat (B,I,J,D), C-contiguous."""
    if _raw(u):
        return capsule_kernels.capsule_predict(u, W)
    xp = array_module(u)
    if xp is not np:
        return xp.einsum("ijdk,bik->bijd", W, u)
    b, i, k = u.shape
    _, j, d, _ = W.shape
    # One GEMM per input capsule, (B, K) @ (K, J*D), written straight into its strided slice of a
    # C-contiguous result (BLAS takes the row stride): 3x faster than a copy afterwards.
    out = np.empty((b, i, j * d), dtype=np.result_type(u, W))
    np.matmul(u.transpose(1, 0, 2), W.reshape(i, j * d, k).transpose(0, 2, 1), out=out.transpose(1, 0, 2))
    return out.reshape(b, i, j, d)


def grad_u_array(g, W):
    """g (B,I,J,D), W (I,J,D,K) -> (B,I,K): sum over j, d of W g."""
    if _raw(g):
        return capsule_kernels.capsule_grad_u(g, W)
    xp = array_module(g)
    b, i, j, d = g.shape
    out = xp.matmul(g.reshape(b, i, j * d).transpose(1, 0, 2), W.reshape(i, j * d, W.shape[3]))
    return out.transpose(1, 0, 2)


def grad_w_array(g, u):
    """g (B,I,J,D), u (B,I,K) -> (I,J,D,K): sum over the batch of g u."""
    if _raw(g):
        return capsule_kernels.capsule_grad_w(g, u)
    return array_module(g).einsum("bijd,bik->ijdk", g, u, optimize=True)


def weighted_sum_array(c, u_hat):
    """c (B,I,J), u_hat (B,I,J,D) -> s (B,J,D)."""
    if _raw(c):
        return routing_kernels.routing_weighted_sum(c, u_hat)
    return array_module(c).einsum("bij,bijd->bjd", c, u_hat)


def agreement_array(u_hat, v):
    """u_hat (B,I,J,D), v (B,J,D) -> a (B,I,J)."""
    if _raw(u_hat):
        return routing_kernels.routing_agreement(u_hat, v)
    xp = array_module(u_hat)
    # (B, J, I, D) @ (B, J, D, 1): one GEMV per (example, output capsule)
    return xp.matmul(u_hat.transpose(0, 2, 1, 3), v[..., None])[..., 0].transpose(0, 2, 1)


class CapsulePredict(Function):
    def forward(self, u, W):
        return predict_array(u, W)

    def backward(self, g):
        u, W = self.inputs
        gu = CapsuleGradU()(g, W) if self.needs_grad[0] else None
        gw = CapsuleGradW()(g, u) if self.needs_grad[1] else None
        return gu, gw


class CapsuleGradU(Function):
    """(g, W) -> sum_{j,d} W g: bilinear; its adjoints are the prediction and CapsuleGradW."""

    def forward(self, g, W):
        return grad_u_array(g, W)

    def backward(self, h):
        g, W = self.inputs
        gg = CapsulePredict()(h, W) if self.needs_grad[0] else None
        gw = CapsuleGradW()(g, h) if self.needs_grad[1] else None
        return gg, gw


class CapsuleGradW(Function):
    """(g, u) -> sum_b g u: bilinear; its adjoints are the prediction and CapsuleGradU."""

    def forward(self, g, u):
        return grad_w_array(g, u)

    def backward(self, h):
        g, u = self.inputs
        gg = CapsulePredict()(u, h) if self.needs_grad[0] else None
        gu = CapsuleGradU()(g, h) if self.needs_grad[1] else None
        return gg, gu


class RoutingWeightedSum(Function):
    def forward(self, c, u_hat):
        return weighted_sum_array(c, u_hat)

    def backward(self, gs):
        c, u_hat = self.inputs
        gc = RoutingAgreement()(u_hat, gs) if self.needs_grad[0] else None
        gu = expand_dims(c, -1) * expand_dims(gs, 1) if self.needs_grad[1] else None
        return gc, gu


class RoutingAgreement(Function):
    def forward(self, u_hat, v):
        return agreement_array(u_hat, v)

    def backward(self, ga):
        u_hat, v = self.inputs
        gu = expand_dims(ga, -1) * expand_dims(v, 1) if self.needs_grad[0] else None
        gv = RoutingWeightedSum()(ga, u_hat) if self.needs_grad[1] else None
        return gu, gv


def _check(op, condition, **shapes):
    if not condition:
        described = ", ".join(f"{name} {tuple(shape)}" for name, shape in shapes.items())
        raise ShapeError(f"{op}: incompatible shapes: {described}")


def capsule_predict(u, W) -> Tensor:
    """Capsule predictions u_hat[b,i,j,d] = sum_k W[i,j,d,k] u[b,i,k].

    Args:
        u: (B, I, K) input capsules. W: (I, J, D, K) transformation matrices.
    Returns:
        (B, I, J, D): each input capsule's prediction for each output capsule.
    """
    u, W = as_tensor(u), as_tensor(W)
    _check("capsule_predict", u.ndim == 3 and W.ndim == 4 and u.shape[1] == W.shape[0] and u.shape[2] == W.shape[3],
           u=u.shape, W=W.shape)
    return CapsulePredict()(u, W)


def routing_weighted_sum(c, u_hat) -> Tensor:
    """s[b,j,d] = sum_i c[b,i,j] u_hat[b,i,j,d]: c (B, I, J), u_hat (B, I, J, D) -> (B, J, D)."""
    c, u_hat = as_tensor(c), as_tensor(u_hat)
    _check("routing_weighted_sum", c.ndim == 3 and u_hat.ndim == 4 and c.shape == u_hat.shape[:3],
           c=c.shape, u_hat=u_hat.shape)
    return RoutingWeightedSum()(c, u_hat)


def routing_agreement(u_hat, v) -> Tensor:
    """a[b,i,j] = sum_d u_hat[b,i,j,d] v[b,j,d]: u_hat (B, I, J, D), v (B, J, D) -> (B, I, J)."""
    u_hat, v = as_tensor(u_hat), as_tensor(v)
    _check("routing_agreement", u_hat.ndim == 4 and v.ndim == 3
           and v.shape == (u_hat.shape[0],) + u_hat.shape[2:], u_hat=u_hat.shape, v=v.shape)
    return RoutingAgreement()(u_hat, v)
