"""Dynamic routing between capsules (Sabour, Frosst & Hinton 2017, Procedure 1), from engine ops,
and ``CapsuleLayer``, the layer of the routings "dynamic" and "uniform" (``uniform.py``).

Every line is a differentiable op, so the gradient through each iteration is derived by the
engine. ``gradient`` chooses how much of it flows (``GRADIENT_MODES``):

    "full"    through every iteration, as the paper's official code does;
    "detach"  through u_hat only in the last iteration; the earlier iterations, which only set the
              coupling coefficients, see a detached u_hat (as several public implementations do).

Two options follow the authors' TensorFlow code (Sarasra/models, research/capsules,
models/layers/layers.py ``_update_routing``): ``bias``, added to s_j before the squash in every
iteration, and ``leaky_routing`` (``_leaky_routing``: a zero logit joins the softmax over the
output capsules). The capsule nonlinearity is ``squash`` (a function over the last axis,
``squash.squash_function``; default Sabour et al.'s). Trace: iteration r's logits b_r, coupling
c_r, weighted s_r, outputs v_r; u_hat_sum = u_hat in the weighted sum, u_hat_agreement and
agreement = u_hat in <u_hat, v_r> and that product, for r < iterations - 1.
"""
from __future__ import annotations

import tinygrad_caps as tc
from tinygrad_caps import functional as F

from ..squash import DEFAULT_SQUASH_EPS, sabour_squash
from ..trace import RoutingTrace
from .base import RoutingLayer, Routed
from .common import GRADIENT_MODES, _check_bias, _routing_result, weighted_sum
from .uniform import uniform_routing

ROUTING_KINDS = ("dynamic", "uniform")  # the routings of a CapsuleLayer; every routing: registry.routing_names()


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


def routing_coupling(logits, leaky_routing: bool = False):
    """Coupling coefficients c (B, I, J) from routing logits b (B, I, J): the softmax over the J
    output capsules of each input capsule; with ``leaky_routing`` an extra logit fixed at 0 joins
    that softmax and its share is dropped, so each row sums to less than 1."""
    if not leaky_routing:
        return F.softmax(logits, axis=2)
    batch, inputs, _ = logits.shape
    leak = tc.zeros((batch, inputs, 1), dtype=logits.dtype, device=logits.device)
    return F.softmax(F.concatenate([leak, logits], axis=2), axis=2)[:, :, 1:]


class CapsuleLayer(RoutingLayer):
    """Dynamic routing (``routing="dynamic"``, Procedure 1; ``iterations`` and ``gradient`` apply) or
    uniform coupling (``routing="uniform"``, c = 1/J, one weighted sum). Parameters: weight (I, J, D,
    K) and, with ``bias``, bias (J, D) added to the weighted sum before the squash in every iteration
    (zero at initialization; see ``CapsNet``). ``leaky_routing`` adds the "none of the above" logit;
    ``squash`` is the nonlinearity (a function over the last axis; default Sabour et al.'s)."""

    has_bias = has_leaky_routing = True

    def __init__(self, in_caps, in_dim, out_caps, out_dim, iterations=3, gradient="full", routing="dynamic",
                 bias=False, leaky_routing=False, squash=None):
        if routing not in ROUTING_KINDS:
            raise ValueError(f"{type(self).__name__}: routing must be one of {ROUTING_KINDS}, got {routing!r}")
        super().__init__(in_caps, in_dim, out_caps, out_dim, routing=routing, iterations=iterations,
                         gradient=gradient, bias=bias, leaky_routing=leaky_routing, squash=squash)

    def forward(self, u, return_coupling=False, return_trace=False, activations=None):
        return self._routed(F.capsule_predict(u, self.weight), return_coupling, return_trace)

    def route_votes(self, u_hat, u, activations, trace):
        routed = self._routed(u_hat, False, trace)
        return Routed(routed[0], None, routed[1]) if trace else Routed(routed)

    def _routed(self, u_hat, return_coupling, return_trace):
        """dynamic_routing's or uniform_routing's result on the votes u_hat (B, I, J, D)."""
        if self.routing == "uniform":
            return uniform_routing(u_hat, self.bias, return_coupling, leaky_routing=self.leaky_routing,
                                   trace=return_trace, squash=self.squash)
        return dynamic_routing(u_hat, self.iterations, self.gradient, return_coupling, trace=return_trace,
                               leaky_routing=self.leaky_routing, bias=self.bias, squash=self.squash)


class DigitCaps(CapsuleLayer):
    """The top capsule layer, one capsule per class: a ``CapsuleLayer`` with weight (I, J, D, K)."""
