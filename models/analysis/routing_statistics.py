"""Per-iteration statistics of a RoutingTrace: how polarized the coupling coefficients are, how the
output capsules differ across the batch, how well predictions agree with outputs, and how much
gradient reaches u_hat through each iteration and path.

Peer et al. (2019) define the T-score (1 - normalized coupling entropy; 0 uniform, 1 one-hot) and
the D-score (how much output capsule lengths vary over the batch); Paik et al. (2019) follow the
polarization of the coupling coefficients over iterations.
"""
from __future__ import annotations

import math

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps import functional as F
from tinygrad_caps.backend import array_module, is_cupy_array, on_device_of, to_numpy
from tinygrad_caps.tensor import Tensor

STATISTICS = ("coupling_entropy", "t_score", "polarization", "d_score", "agreement_cosine", "grad_norm_sum",
              "grad_norm_agreement")
_EPS = 1e-12


def _values(t) -> np.ndarray:
    """A float64 NumPy copy of a Tensor's (or array's) values (for the small (B, I, J) and (B, J, D) ones)."""
    return np.asarray(to_numpy(t.data if isinstance(t, Tensor) else t), dtype=np.float64)


def _native(t):
    """A Tensor's (or array's) NumPy/CuPy data as it is: u_hat-sized arrays are read in place, not copied."""
    if isinstance(t, Tensor):
        return t.data
    return t if is_cupy_array(t) else np.asarray(t)


def _array_key(array) -> tuple:
    """(address, shape, strides, dtype): equal for two views of the same memory, read the same way."""
    address = array.__array_interface__["data"][0] if isinstance(array, np.ndarray) else array.data.ptr
    return address, tuple(array.shape), tuple(array.strides), array.dtype.str


def prediction_lengths(u_hat):
    """|u_hat[b, i, j]| (B, I, J), on u_hat's device and in its dtype."""
    u = _native(u_hat)
    xp = array_module(u)
    with on_device_of(u):
        return xp.sqrt(xp.einsum("bijd,bijd->bij", u, u))


def coupling_entropy(c) -> float:
    """Mean over (b, i) of H(c[b, i, :]) / log J for couplings c (B, I, J): 1 uniform, 0 one-hot."""
    c = _native(c)
    if c.ndim != 3:
        raise ValueError(f"coupling_entropy: expected c (B, I, J), got shape {c.shape}")
    if c.shape[-1] < 2:
        return 0.0  # with one output capsule the coupling is always one-hot
    xp = array_module(c)
    with on_device_of(c):
        # c log c -> 0 as c -> 0: clamping c inside the log to the smallest normal number gives 0 * finite.
        c_log_c = c * xp.log(xp.maximum(c, np.finfo(c.dtype).tiny))
        return float(-c_log_c.sum(axis=-1).mean(dtype=np.float64) / math.log(c.shape[-1]))


def polarization(c) -> float:
    """Mean over (b, i) of max_j c[b, i, j] for couplings c (B, I, J)."""
    c = _native(c)
    with on_device_of(c):
        return float(c.max(axis=-1).mean(dtype=np.float64))


def d_score(v) -> float:
    """Max over j of the standard deviation over the batch of |v[b, j]|, for outputs v (B, J, D)."""
    v = _values(v)
    if v.ndim != 3:
        raise ValueError(f"d_score: expected v (B, J, D), got shape {v.shape}")
    return float(np.linalg.norm(v, axis=-1).std(axis=0).max())


def agreement_cosine(u_hat, v, agreement=None, u_hat_lengths=None) -> float:
    """Mean over (b, i, j) of cos(u_hat[b, i, j], v[b, j]) for u_hat (B, I, J, D) and v (B, J, D).

    ``agreement`` (B, I, J), the dot products <u_hat, v> when already known (a trace's a_r), and
    ``u_hat_lengths`` (B, I, J) from ``prediction_lengths`` spare the passes over u_hat.
    """
    u, v = _native(u_hat), _native(v)
    if u.ndim != 4 or tuple(v.shape) != (u.shape[0],) + tuple(u.shape[2:]):
        raise ValueError(f"agreement_cosine: expected u_hat (B, I, J, D) and v (B, J, D), got {u.shape} and {v.shape}")
    xp = array_module(u)
    with on_device_of(u):
        if agreement is None:
            with tc.no_grad():
                agreement = F.routing_agreement(Tensor._wrap(u), Tensor._wrap(v.astype(u.dtype, copy=False)))
        dot = _native(agreement)
        lengths = prediction_lengths(u) if u_hat_lengths is None else _native(u_hat_lengths)
        norms = lengths * xp.sqrt((v * v).sum(axis=-1))[:, None, :]
        return float((dot / xp.maximum(norms, _EPS)).mean(dtype=np.float64))


def _grad_norm(t, tracked=None):
    """Frobenius norm of ``t.grad`` (or ``tracked``, the norm a trace recorded during the backward);
    0.0 when ``t`` is detached (no gradient can reach it); None when it could have one but none was kept."""
    if not getattr(t, "requires_grad", False):
        return 0.0
    if t.grad is None:
        return tracked
    g = t.grad.data
    with on_device_of(g):
        return float(array_module(g).linalg.norm(g.ravel()))  # one BLAS dot, in the gradient's own dtype


def routing_statistics(trace) -> dict:
    """Statistics of every iteration of one routing layer.

    Args:
        trace: a RoutingTrace (its coupling and outputs at least; u_hat_sum for the cosine and the
            gradient norms, which need ``trace.retain_grad()`` before a backward).
    Returns:
        A dict with one list (one entry per iteration r = 0..R-1) per statistic:
        "coupling_entropy", "t_score", "polarization", "d_score", "agreement_cosine", and
        "grad_norm_sum" / "grad_norm_agreement", the Frobenius norms of ``u_hat_sum[r].grad`` /
        ``u_hat_agreement[r].grad`` (0.0 where that use of u_hat is detached; None where no gradient
        was retained or tracked (``trace.track_grad_norms()``), and for the agreement of the last
        iteration, which does not exist).
    """
    iterations = len(trace.coupling)
    if len(trace.outputs) != iterations:
        raise ValueError(f"routing_statistics: the trace has {iterations} couplings but {len(trace.outputs)} outputs")
    stats = {name: [] for name in STATISTICS}
    lengths = {}  # |u_hat| per distinct u_hat array: every u_hat_sum[r] of a real trace views the same one
    for r in range(iterations):
        entropy = coupling_entropy(trace.coupling[r])
        stats["coupling_entropy"].append(entropy)
        stats["t_score"].append(1.0 - entropy)
        stats["polarization"].append(polarization(trace.coupling[r]))
        stats["d_score"].append(d_score(trace.outputs[r]))
        has_u_hat = r < len(trace.u_hat_sum)
        cosine = None
        if has_u_hat:
            u = _native(trace.u_hat_sum[r])
            key = _array_key(u)
            if key not in lengths:
                lengths[key] = prediction_lengths(u)
            known = trace.agreement[r] if r < len(trace.agreement) else None
            cosine = agreement_cosine(u, trace.outputs[r], known, lengths[key])
        stats["agreement_cosine"].append(cosine)
        tracked = getattr(trace, "grad_norms", {})
        stats["grad_norm_sum"].append(_grad_norm(trace.u_hat_sum[r], tracked.get(("u_hat_sum", r))) if has_u_hat else None)
        agreement_path = r < iterations - 1 and r < len(trace.u_hat_agreement)
        stats["grad_norm_agreement"].append(
            _grad_norm(trace.u_hat_agreement[r], tracked.get(("u_hat_agreement", r))) if agreement_path else None)
    return stats


def per_iteration(stats: dict) -> list:
    """The dict of lists from ``routing_statistics`` as one dict per iteration: [{"iteration": 0, ...}, ...]."""
    count = len(stats["coupling_entropy"])
    return [dict({"iteration": r}, **{name: stats[name][r] for name in STATISTICS}) for r in range(count)]
