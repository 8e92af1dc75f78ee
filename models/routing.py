"""Dynamic routing between capsules (Sabour, Frosst & Hinton 2017, Procedure 1), from engine ops.

Every line is a differentiable op, so the gradient through each iteration is derived by the
engine. ``gradient`` chooses how much of it flows:

    "full"    through every iteration, as the paper's official code does;
    "detach"  through u_hat only in the last iteration; the earlier iterations, which only set the
              coupling coefficients, see a detached u_hat (as several public implementations do).
"""
from __future__ import annotations

import tinygrad_caps as tc
from tinygrad_caps import functional as F

GRADIENT_MODES = ("full", "detach")


def dynamic_routing(u_hat, iterations: int = 3, gradient: str = "full", return_coupling: bool = False):
    """Route predictions to output capsules.

    Args:
        u_hat: (B, I, J, D) predictions of the I input capsules for the J output capsules.
        iterations: routing iterations r >= 1 (all of them run).
        gradient: "full" or "detach" (see the module docstring).
        return_coupling: also return the coupling coefficients c (B, I, J) of every iteration.
    Returns:
        v: (B, J, D) output capsules; with ``return_coupling``, (v, [c_1, ..., c_r]).
    """
    if iterations < 1:
        raise ValueError(f"dynamic_routing: iterations must be >= 1, got {iterations}")
    if gradient not in GRADIENT_MODES:
        raise ValueError(f"dynamic_routing: gradient must be one of {GRADIENT_MODES}, got {gradient!r}")
    if u_hat.ndim != 4:
        raise ValueError(f"dynamic_routing: expected u_hat (B, I, J, D), got shape {u_hat.shape}")
    batch, inputs, outputs, _ = u_hat.shape
    frozen = u_hat.detach() if gradient == "detach" else u_hat
    logits = tc.zeros((batch, inputs, outputs), dtype=u_hat.dtype, device=u_hat.device)  # b = 0, per example
    couplings = []
    for r in range(iterations):
        last = r == iterations - 1
        predictions = u_hat if last else frozen
        c = F.softmax(logits, axis=2)  # over the J output capsules, for each input capsule
        couplings.append(c)
        v = F.squash(F.routing_weighted_sum(c, predictions), axis=-1)
        if not last:
            logits = logits + F.routing_agreement(predictions, v)
    return (v, couplings) if return_coupling else v
