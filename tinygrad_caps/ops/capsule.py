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

from .. import _parallel as parallel
from ..autograd.deferred import DeferredGradient
from ..autograd.grad_mode import is_grad_enabled
from ..backend import array_module
from ..errors import GraphError, ShapeError
from ..kernels import capsule as capsule_kernels
from ..kernels import launch as kernel_launch
from ..kernels import routing as routing_kernels
from ..tensor import Tensor, as_tensor
from ._common import Bilinear
from .shape import expand_dims


def _runner(array):
    """The kernel runner for ``array`` (None: the NumPy/CuPy formulation below)."""
    return kernel_launch.kernel_runner_for(array)


def predict_array(u, W):
    """u (B,I,K), W (I,J,D,K) -> u_hat (B,I,J,D), C-contiguous."""
    runner = _runner(u)
    # W[i] must fit a block's shared memory (up to 12,288 float32 values); larger layers take the
    # array formulation below
    if runner is not None and capsule_kernels.predict_fits(W.shape, u.dtype):
        return capsule_kernels.capsule_predict(u, W, runner=runner)
    xp = array_module(u)
    if xp is not np:
        return xp.einsum("ijdk,bik->bijd", W, u)
    b, i, k = u.shape
    _, j, d, _ = W.shape
    # One GEMM per input capsule, (B, K) @ (K, J*D), written straight into its strided slice of a
    # C-contiguous result (BLAS takes the row stride): no copy afterwards. The GEMMs
    # are too small for BLAS's threads, so the input capsules are split over the cores.
    out = np.empty((b, i, j * d), dtype=np.result_type(u, W))
    u_by_capsule, w_by_capsule = u.transpose(1, 0, 2), W.reshape(i, j * d, k).transpose(0, 2, 1)
    parallel.matmul_by_slices(u_by_capsule, w_by_capsule, out.transpose(1, 0, 2), out.nbytes)
    return out.reshape(b, i, j, d)


def grad_u_array(g, W):
    """g (B,I,J,D), W (I,J,D,K) -> (B,I,K): sum over j, d of W g."""
    runner = _runner(g)
    if runner is not None:
        return capsule_kernels.capsule_grad_u(g, W, runner=runner)
    xp = array_module(g)
    b, i, j, d = g.shape
    g_by_capsule, w_by_capsule = g.reshape(b, i, j * d).transpose(1, 0, 2), W.reshape(i, j * d, W.shape[3])
    if xp is not np:
        return xp.matmul(g_by_capsule, w_by_capsule).transpose(1, 0, 2)
    out = np.empty((b, i, W.shape[3]), dtype=np.result_type(g, W))
    parallel.matmul_by_slices(g_by_capsule, w_by_capsule, out.transpose(1, 0, 2), g.nbytes)
    return out


def grad_w_array(g, u):
    """g (B,I,J,D), u (B,I,K) -> (I,J,D,K): sum over the batch of g u."""
    runner = _runner(g)
    if runner is not None:
        return capsule_kernels.capsule_grad_w(g, u, runner=runner)
    xp = array_module(g)
    if xp is not np:
        return xp.einsum("bijd,bik->ijdk", g, u, optimize=True)
    b, i, j, d = g.shape
    out = np.empty((i, j * d, u.shape[2]), dtype=np.result_type(g, u))
    # One (J*D, B) @ (B, K) GEMM per input capsule, straight from strided views (faster than einsum).
    g_by_capsule, u_by_capsule = g.reshape(b, i, j * d).transpose(1, 2, 0), u.transpose(1, 0, 2)
    parallel.matmul_by_slices(g_by_capsule, u_by_capsule, out, g.nbytes)
    return out.reshape(i, j, d, u.shape[2])


def weighted_sum_array(c, u_hat):
    """c (B,I,J), u_hat (B,I,J,D) -> s (B,J,D)."""
    runner = _runner(c)
    if runner is not None:
        return routing_kernels.routing_weighted_sum(c, u_hat, runner=runner)
    xp = array_module(c)
    if xp is not np:
        return xp.einsum("bij,bijd->bjd", c, u_hat)
    out = np.empty((c.shape[0], c.shape[2], u_hat.shape[3]), dtype=np.result_type(c, u_hat))
    # (B, J, 1, I) @ (B, J, I, D): one vector-matrix product per (example, output capsule), on
    # strided views of c and u_hat (faster than einsum, near one read of u_hat).
    c_rows, u_by_output = c.transpose(0, 2, 1)[:, :, None, :], u_hat.transpose(0, 2, 1, 3)
    parallel.matmul_by_slices(c_rows, u_by_output, out[:, :, None, :], u_hat.nbytes)
    return out


def agreement_array(u_hat, v):
    """u_hat (B,I,J,D), v (B,J,D) -> a (B,I,J)."""
    runner = _runner(u_hat)
    if runner is not None and routing_kernels.agreement_fits(u_hat.shape, u_hat.dtype):
        return routing_kernels.routing_agreement(u_hat, v, runner=runner)
    xp = array_module(u_hat)
    if xp is not np:
        return xp.matmul(u_hat.transpose(0, 2, 1, 3), v[..., None])[..., 0].transpose(0, 2, 1)
    b, i, j, _ = u_hat.shape
    out = np.empty((b, j, i), dtype=np.result_type(u_hat, v))
    # (B, J, I, D) @ (B, J, D, 1): one matrix-vector product per (example, output capsule)
    parallel.matmul_by_slices(u_hat.transpose(0, 2, 1, 3), v[..., None], out[..., None], u_hat.nbytes)
    return out.transpose(0, 2, 1)


def outer_products_array(terms):
    """sum_t p_t[b,i,j] q_t[b,j,d] for pairs (p_t (B,I,J), q_t (B,J,D)) -> (B, I, J, D).

    With kernels (the GPU, or the emulation) one launch writes the sum (``routing_outer_products``;
    plain CuPy, or mixed dtypes there, take the broadcast products). On NumPy one term is the
    broadcast product; several are one small GEMM per (example, output capsule), (I, T) @ (T, D),
    written straight into the strided result: routing's five u_hat gradients in one pass over the
    (B, I, J, D) result instead of five products and their sums (the same values up to rounding,
    as BLAS accumulates in its own order).
    """
    runner = _runner(terms[0][0])
    if runner is not None and len({p.dtype for p, _ in terms} | {q.dtype for _, q in terms}) == 1:
        xp = array_module(terms[0][0])
        return routing_kernels.routing_outer_products(xp.stack([p for p, _ in terms]), xp.stack([q for _, q in terms]),
                                                      runner=runner)
    if array_module(terms[0][0]) is not np:
        return sum(p[..., None] * q[:, None] for p, q in terms)
    if len(terms) == 1:
        p, q = terms[0]
        return parallel.binary(np.multiply, p[..., None], q[:, None])
    p = np.stack([p for p, _ in terms], axis=-1)  # (B, I, J, T)
    q = np.stack([q for _, q in terms], axis=2)   # (B, J, T, D)
    out = np.empty(p.shape[:3] + q.shape[3:], dtype=np.result_type(p, q))
    parallel.matmul_by_slices(p.transpose(0, 2, 1, 3), q, out.transpose(0, 2, 1, 3), out.nbytes)
    return out


class OuterProducts(DeferredGradient):
    """The u_hat gradient of the routing contractions, sum_t p_t[b,i,j] q_t[b,j,d], deferred: the
    weighted sum's c * dL/ds and the agreement's dL/da * v of every iteration wait here as small
    factors and are built in one pass (``outer_products_array``) when u_hat's gradient is needed."""

    def __init__(self, terms):
        self.terms = list(terms)
        p, q = self.terms[0]
        self.shape = p.shape + q.shape[-1:]
        self.dtype = np.result_type(p, q)

    def materialize(self) -> Tensor:
        return Tensor._wrap(outer_products_array(self.terms))

    def merge(self, other):
        if isinstance(other, OuterProducts) and other.shape == self.shape and other.dtype == self.dtype:
            return OuterProducts(self.terms + other.terms)
        return None


def outer_product_gradient(p: Tensor, q: Tensor):
    """p[b,i,j] q[b,j,d] (p (B, I, J), q (B, J, D)) as a gradient for a backward to return:
    deferred (``OuterProducts``) when nothing is recorded and both are NumPy arrays or go to our
    kernels, else the recorded broadcast product."""
    if not is_grad_enabled() and (type(p.data) is np.ndarray or _runner(p.data) is not None) \
            and type(p.data) is type(q.data):
        return OuterProducts([(p.data, q.data)])
    return expand_dims(p, -1) * expand_dims(q, 1)


class CapsulePredict(Bilinear):
    def forward(self, u, W):
        return predict_array(u, W)

    def backward(self, g):
        u, W = self.inputs
        runner = _runner(g.data)
        if all(self.needs_grad) and runner is not None and capsule_kernels.grad_fits(W.shape, g.dtype):
            # One kernel computes both adjoints in one pass over g; each still enters the graph
            # as its own op, so higher derivatives are derived exactly as below.
            gu, gw = capsule_kernels.capsule_grad(g.data, u.data, W.data, runner=runner)
            return CapsuleGradU(result=gu)(g, W), CapsuleGradW(result=gw)(g, u)
        gu = CapsuleGradU()(g, W) if self.needs_grad[0] else None
        gw = CapsuleGradW()(g, u) if self.needs_grad[1] else None
        return gu, gw


class CapsuleGradU(Bilinear):
    """(g, W) -> sum_{j,d} W g: bilinear; its adjoints are the prediction and CapsuleGradW.

    ``result``: this op's value, already computed (with grad_W) by the one-pass adjoint kernel."""

    def __init__(self, result=None):
        self._result = result

    def forward(self, g, W):
        result, self._result = self._result, None
        return grad_u_array(g, W) if result is None else result

    def backward(self, h):
        g, W = self.inputs
        gg = CapsulePredict()(h, W) if self.needs_grad[0] else None
        gw = CapsuleGradW()(g, h) if self.needs_grad[1] else None
        return gg, gw


class CapsuleGradW(Bilinear):
    """(g, u) -> sum_b g u: bilinear; its adjoints are the prediction and CapsuleGradU.

    ``result``: this op's value, already computed (with grad_u) by the one-pass adjoint kernel."""

    def __init__(self, result=None):
        self._result = result

    def forward(self, g, u):
        result, self._result = self._result, None
        return grad_w_array(g, u) if result is None else result

    def backward(self, h):
        g, u = self.inputs
        gg = CapsulePredict()(u, h) if self.needs_grad[0] else None
        gu = CapsuleGradU()(g, h) if self.needs_grad[1] else None
        return gg, gu


class RoutingWeightedSum(Bilinear):
    def forward(self, c, u_hat):
        return weighted_sum_array(c, u_hat)

    def backward(self, gs):
        c, u_hat = self.inputs
        gc = RoutingAgreement()(u_hat, gs) if self.needs_grad[0] else None
        gu = outer_product_gradient(c, gs) if self.needs_grad[1] else None
        return gc, gu


class RoutingAgreement(Bilinear):
    def forward(self, u_hat, v):
        return agreement_array(u_hat, v)

    def backward(self, ga):
        u_hat, v = self.inputs
        gu = outer_product_gradient(ga, v) if self.needs_grad[0] else None
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


def fused_routing_available(u_hat) -> bool:
    """Whether ``routing_forward`` can run for this u_hat: a kernel path exists for its array, its
    output capsules fit the kernel's shared memory, and no gradient would be recorded (grad mode
    off, or u_hat does not require a gradient)."""
    u_hat = as_tensor(u_hat)
    recording = is_grad_enabled() and u_hat.requires_grad
    return (not recording and u_hat.ndim == 4 and _runner(u_hat.data) is not None
            and routing_kernels.forward_fits(u_hat.shape, u_hat.dtype))


def routing_forward(u_hat, iterations: int, eps: float = 1e-8) -> Tensor:
    """Dynamic routing's output capsules v (B, J, D) from u_hat (B, I, J, D), every iteration in
    one kernel launch (logits from 0; softmax over J, weighted sum, ``squash(eps)``, agreement).

    Forward only, for evaluation: it records no graph, so it raises GraphError where a gradient
    would be recorded, and RuntimeError where no kernel path exists (see
    ``fused_routing_available``). The gradient of routing is always derived op by op.
    """
    u_hat = as_tensor(u_hat)
    if is_grad_enabled() and u_hat.requires_grad:
        raise GraphError("routing_forward records no gradient: call it under no_grad() or on a u_hat "
                         "that does not require one")
    _check("routing_forward", u_hat.ndim == 4, u_hat=u_hat.shape)
    runner = _runner(u_hat.data)
    if runner is None:
        raise RuntimeError("routing_forward: no kernel path for these arrays (a CuPy array with raw kernels on, "
                           "or a NumPy array inside kernels.launch.run_numpy_arrays_with)")
    v, _, _ = routing_kernels.routing_forward(u_hat.data, iterations, eps, runner=runner)
    return Tensor._wrap(v)
