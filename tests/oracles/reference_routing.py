"""Procedure 1 of Sabour, Frosst & Hinton (2017) in plain NumPy, written independently of the engine.

Used as the oracle for ``dynamic_routing`` where PyTorch is not installed: explicit loops over the
input capsules for the weighted sum and the agreement, and gradients by central differences of this
forward in float64 (so nothing here shares code or derivation with the engine's backward).
"""
import numpy as np

SQUASH_EPS = 1e-8  # the engine's squash epsilon: |s|^2 / (1 + |s|^2) * s / sqrt(|s|^2 + eps)


def softmax_over_outputs(logits, leaky=False):
    """Softmax of (B, I, J) logits over J, the output capsules, for every example and input capsule.

    ``leaky``: one more logit, fixed at 0, joins the softmax ("none of the above") and its share is
    dropped, so each row sums to less than 1.
    """
    if leaky:
        logits = np.concatenate([np.zeros(logits.shape[:2] + (1,)), logits], axis=2)
    shifted = logits - logits.max(axis=2, keepdims=True)
    e = np.exp(shifted)
    c = e / e.sum(axis=2, keepdims=True)
    return c[:, :, 1:] if leaky else c


def squash(s):
    """(B, J, D) -> (B, J, D): |s|^2 / (1 + |s|^2) * s / sqrt(|s|^2 + eps) along D."""
    squared = (s * s).sum(axis=-1, keepdims=True)
    return squared / (1.0 + squared) * s / np.sqrt(squared + SQUASH_EPS)


def route(u_hat, iterations, frozen=None, bias=None, leaky=False):
    """Procedure 1. u_hat (B, I, J, D) is used in the last iteration; ``frozen`` (default u_hat) in
    the earlier ones, which is how the "detach" gradient mode differs from "full". ``bias`` (J, D)
    is added to every iteration's weighted sum before the squash; ``leaky`` as in softmax_over_outputs.

    Returns:
        v (B, J, D) and the list of coupling coefficients c (B, I, J) of every iteration.
    """
    u_hat = np.asarray(u_hat, dtype=np.float64)
    frozen = u_hat if frozen is None else np.asarray(frozen, dtype=np.float64)
    batch, inputs, outputs, dim = u_hat.shape
    logits = np.zeros((batch, inputs, outputs))
    couplings = []
    for r in range(iterations):
        last = r == iterations - 1
        predictions = u_hat if last else frozen
        c = softmax_over_outputs(logits, leaky)
        couplings.append(c)
        s = np.zeros((batch, outputs, dim)) if bias is None else np.broadcast_to(bias, (batch, outputs, dim)).copy()
        for i in range(inputs):
            s += c[:, i, :, None] * predictions[:, i]
        v = squash(s)
        if not last:
            agreement = np.zeros((batch, inputs, outputs))
            for i in range(inputs):
                agreement[:, i] = (predictions[:, i] * v).sum(axis=-1)
            logits = logits + agreement
    return v, couplings


def central_differences(f, x, eps=1e-6):
    """Gradient of the scalar f at the float64 array x, element by element."""
    x = np.asarray(x, dtype=np.float64)
    grad = np.zeros_like(x)
    flat, out = x.reshape(-1), grad.reshape(-1)
    for k in range(flat.size):
        values = []
        for step in (eps, -eps):
            shifted = flat.copy()
            shifted[k] += step
            values.append(f(shifted.reshape(x.shape)))
        out[k] = (values[0] - values[1]) / (2 * eps)
    return grad


def route_gradient(u_hat, iterations, gradient, cotangent, bias=None, leaky=False):
    """d/d u_hat of sum(cotangent * v) by central differences; "detach" holds the earlier iterations'
    u_hat fixed at its value (they only set the coupling coefficients)."""
    frozen = np.array(u_hat, dtype=np.float64) if gradient == "detach" else None
    return central_differences(lambda u: (route(u, iterations, frozen, bias, leaky)[0] * cotangent).sum(), u_hat)


def route_bias_gradient(u_hat, iterations, bias, cotangent, leaky=False):
    """d/d bias of sum(cotangent * v) by central differences (the same in both gradient modes)."""
    return central_differences(lambda b: (route(u_hat, iterations, None, b, leaky)[0] * cotangent).sum(), bias)
