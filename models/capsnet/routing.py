"""Dynamic routing between capsules (Sabour, Frosst & Hinton 2017, Procedure 1), from engine ops.

Every line is a differentiable op, so the gradient through each iteration is derived by the
engine. ``gradient`` chooses how much of it flows:

    "full"    through every iteration, as the paper's official code does;
    "detach"  through u_hat only in the last iteration; the earlier iterations, which only set the
              coupling coefficients, see a detached u_hat (as several public implementations do).

Two options follow the authors' TensorFlow code (Sarasra/models, research/capsules,
models/layers/layers.py ``_update_routing``): ``bias``, added to s_j before the squash in every
iteration, and ``leaky_routing`` (``_leaky_routing``: a zero logit joins the softmax over the
output capsules). ``uniform_routing`` is the no-routing baseline with c = 1/J. Both take the
capsule nonlinearity as ``squash`` (a function over the last axis, ``squash.squash_function``;
default Sabour et al.'s).
"""
from __future__ import annotations

import tinygrad_caps as tc
from tinygrad_caps import functional as F

from .squash import DEFAULT_SQUASH_EPS, sabour_squash
from .trace import RoutingTrace

GRADIENT_MODES = ("full", "detach")
ROUTING_KINDS = ("dynamic", "uniform")  # the two algorithms of this module; every routing: routing_layers.routing_names()


def dynamic_routing(u_hat, iterations: int = 3, gradient: str = "full", return_coupling: bool = False,
                    trace: bool = False, leaky_routing: bool = False, bias=None, squash=None):
    """Route predictions to output capsules.

    Args:
        u_hat: (B, I, J, D) predictions of the I input capsules for the J output capsules.
        iterations: routing iterations r >= 1 (all of them run).
        gradient: "full" or "detach" (see the module docstring).
        return_coupling: also return the coupling coefficients c (B, I, J) of every iteration.
        trace: also return a RoutingTrace of every iteration's tensors (``trace.py``); each
            use of u_hat then enters through an identity node of its own (same values, no copy).
        leaky_routing: add a logit fixed at 0 to the softmax over J ("none of the above"), so the
            coefficients of an input capsule over the J real outputs sum to less than 1.
        bias: None or a (J, D) Tensor beta added to the weighted sum before the squash in every
            iteration, s_j = sum_i c_ij u_hat_j|i + beta_j.
        squash: the nonlinearity v = squash(s) over the last axis (default: Sabour et al.'s, eps 1e-8).
    Returns:
        v: (B, J, D) output capsules; with ``return_coupling``, (v, [c_1, ..., c_r]); with ``trace``,
        (v, trace); with both, (v, [c_1, ..., c_r], trace).
    """
    if iterations < 1:
        raise ValueError(f"dynamic_routing: iterations must be >= 1, got {iterations}")
    if gradient not in GRADIENT_MODES:
        raise ValueError(f"dynamic_routing: gradient must be one of {GRADIENT_MODES}, got {gradient!r}")
    if u_hat.ndim != 4:
        raise ValueError(f"dynamic_routing: expected u_hat (B, I, J, D), got shape {u_hat.shape}")
    batch, inputs, outputs, _ = u_hat.shape
    _check_bias("dynamic_routing", bias, u_hat)
    plain = not (return_coupling or trace or leaky_routing or bias is not None) and _is_default_squash(squash)
    if plain and F.fused_routing_available(u_hat):
        return F.routing_forward(u_hat, iterations)  # no gradient recorded: all iterations in one kernel
    squash = squash or sabour_squash
    frozen = u_hat.detach() if gradient == "detach" else u_hat
    logits = tc.zeros((batch, inputs, outputs), dtype=u_hat.dtype, device=u_hat.device)  # b = 0, per example
    couplings = []
    record = RoutingTrace(gradient=gradient, routing="dynamic") if trace else None
    for r in range(iterations):
        with tc.graph.scope(f"{tc.graph.ROUTING_SCOPE} {r + 1}"):  # how drawings of the graph group it
            last = r == iterations - 1
            predictions = u_hat if last else frozen
            c = routing_coupling(logits, leaky_routing)
            couplings.append(c)
            summed = F.identity(predictions) if trace else predictions
            s = weighted_sum(c, summed, bias)
            v = squash(s)
            if trace:
                record.record(logits=logits, coupling=c, weighted=s, outputs=v, u_hat_sum=summed)
            if not last:
                agreeing = F.identity(predictions) if trace else predictions
                a = F.routing_agreement(agreeing, v)
                if trace:
                    record.record(agreement=a, u_hat_agreement=agreeing)
                logits = logits + a
    return _routing_result(v, couplings if return_coupling else None, record)


def _is_default_squash(squash) -> bool:
    """Whether ``squash`` is the fused kernel's: Sabour et al.'s with eps 1e-8 (None means it)."""
    return squash is None or squash is sabour_squash or (
        getattr(squash, "name", None) == "sabour" and getattr(squash, "eps", None) == DEFAULT_SQUASH_EPS)


def _routing_result(v, couplings, trace):
    """v, then the couplings and the trace where they were asked for."""
    extras = tuple(x for x in (couplings, trace) if x is not None)
    return (v,) + extras if extras else v


def routing_coupling(logits, leaky_routing: bool = False):
    """Coupling coefficients c (B, I, J) from routing logits b (B, I, J): the softmax over the J
    output capsules of each input capsule; with ``leaky_routing`` an extra logit fixed at 0 joins
    that softmax and its share is dropped, so each row sums to less than 1."""
    if not leaky_routing:
        return F.softmax(logits, axis=2)
    batch, inputs, _ = logits.shape
    leak = tc.zeros((batch, inputs, 1), dtype=logits.dtype, device=logits.device)
    return F.softmax(F.concatenate([leak, logits], axis=2), axis=2)[:, :, 1:]


def weighted_sum(c, u_hat, bias=None):
    """s (B, J, D) = sum_i c (B, I, J) * u_hat (B, I, J, D), plus ``bias`` (J, D) when given."""
    s = F.routing_weighted_sum(c, u_hat)
    return s if bias is None else s + bias


def _check_bias(name, bias, u_hat):
    if bias is not None and tuple(bias.shape) != tuple(u_hat.shape[2:]):
        raise ValueError(f"{name}: bias must have shape (J, D) = {tuple(u_hat.shape[2:])} for u_hat {u_hat.shape}, "
                         f"got {tuple(bias.shape)}")


def uniform_routing(u_hat, bias=None, return_coupling: bool = False, leaky_routing: bool = False, trace: bool = False,
                    squash=None):
    """No routing: fixed coupling c_ij = 1/J (1/(J+1) with ``leaky_routing``), one weighted sum and squash.

    The baseline of Paik et al. (2019) and Gu & Tresp (2020); equal to the first iteration of
    ``dynamic_routing``, so there is no iteration count and no gradient mode.

    Args:
        u_hat: (B, I, J, D) predictions. bias: None or (J, D), added before the squash.
        return_coupling: also return [c], the single (B, I, J) coupling (a constant).
        trace: also return a one-iteration RoutingTrace (logits 0, c, s, v, u_hat through an identity node).
        squash: the nonlinearity over the last axis (default: Sabour et al.'s).
    Returns:
        v: (B, J, D); with ``return_coupling``, (v, [c]); with ``trace``, (v, trace); both, (v, [c], trace).
    """
    if u_hat.ndim != 4:
        raise ValueError(f"uniform_routing: expected u_hat (B, I, J, D), got shape {u_hat.shape}")
    _check_bias("uniform_routing", bias, u_hat)
    batch, inputs, outputs, _ = u_hat.shape
    share = 1.0 / (outputs + 1 if leaky_routing else outputs)
    c = tc.full((batch, inputs, outputs), share, dtype=u_hat.dtype, device=u_hat.device)
    summed = F.identity(u_hat) if trace else u_hat
    s = weighted_sum(c, summed, bias)
    v = (squash or sabour_squash)(s)
    record = None
    if trace:
        record = RoutingTrace(gradient="full", routing="uniform")
        logits = tc.zeros((batch, inputs, outputs), dtype=u_hat.dtype, device=u_hat.device)
        record.record(logits=logits, coupling=c, weighted=s, outputs=v, u_hat_sum=summed)
    return _routing_result(v, [c] if return_coupling else None, record)
