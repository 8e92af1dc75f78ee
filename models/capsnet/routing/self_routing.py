"""Self-routing (Hahn, Pyeon & Kim 2019), one step, from engine ops: each input capsule routes by
its own weights; and its layer ``SelfRoutingLayer`` (routing "self-routing").

Votes are u_hat (B, I, J, D). With ``trace=True`` the one-step trace holds logits = agreement =
W_route u + b_route, coupling = c, weighted = outputs = v, activations = a_j; u_hat_sum = u_hat in
the weighted mean (through an identity node of its own); the coupling does not use u_hat but the
input capsules u (B, I, K): they are u_hat_agreement[0], the routing path's input.
"""
from __future__ import annotations

import tinygrad_caps as tc
from tinygrad_caps import functional as F

from ..trace import RoutingTrace
from .base import RoutingLayer, Routed, _parameter
from .common import DEFAULT_EPS, _check_shape, _check_votes, _identity


def self_routing(u_hat, u, activations, route_weight, route_bias, trace: bool = False, eps: float = DEFAULT_EPS):
    """Self-routing (Hahn, Pyeon & Kim 2019), one step: each input capsule routes by its own weights.

    logits_ij = W_route_i u_i + b_route_i; c_ij = softmax over j; a_j = sum_i c_ij a_i / (sum_i a_i + eps);
    v_j = sum_i c_ij a_i u_hat_ij / (sum_i c_ij a_i + eps).

    Args:
        u_hat: (B, I, J, D). u: (B, I, K) the input capsules. activations: a_i (B, I).
        route_weight: (I, J, K). route_bias: (I, J). trace: also return a one-step RoutingTrace.
    Returns:
        (v (B, J, D), a (B, J)), plus the trace with ``trace``.
    """
    name = "self_routing"
    _check_votes(name, u_hat)
    batch, inputs, outputs, _ = u_hat.shape
    if u.ndim != 3 or tuple(u.shape[:2]) != (batch, inputs):
        raise ValueError(f"{name}: u must have shape (B, I, K) = ({batch}, {inputs}, K), got {tuple(u.shape)}")
    _check_shape(name, "activations", activations, (batch, inputs))
    _check_shape(name, "route_weight", route_weight, (inputs, outputs, u.shape[2]))
    _check_shape(name, "route_bias", route_bias, (inputs, outputs))
    routing_input = _identity(u, trace)
    weight = F.reshape(route_weight, (inputs, outputs, 1, u.shape[2]))
    logits = F.reshape(F.capsule_predict(routing_input, weight), (batch, inputs, outputs)) + route_bias
    c = F.softmax(logits, axis=2)
    weighted = c * F.expand_dims(activations, 2)
    mass = F.sum(weighted, axis=1)
    out_activations = mass / (F.sum(activations, axis=1, keepdims=True) + eps)
    summed = _identity(u_hat, trace)
    v = F.routing_weighted_sum(weighted, summed) / F.expand_dims(mass + eps, -1)
    if not trace:
        return v, out_activations
    record = RoutingTrace(gradient="full", dot_agreement=False, routing="self-routing")
    record.record(logits=logits, coupling=c, weighted=v, outputs=v, activations=out_activations, u_hat_sum=summed,
                  agreement=logits, u_hat_agreement=routing_input)
    return v, out_activations, record


class SelfRoutingLayer(RoutingLayer):
    """Self-routing (``self_routing``), one step: parameters weight, route_weight (I, J, K) and
    route_bias (I, J) (zero at the start: c = 1/J). It reads the input activations; its output
    activations are the class scores, and they sum to 1 over the classes."""

    iterative = False
    reads_activations = True
    class_distribution = True

    def __init__(self, in_caps, in_dim, out_caps, out_dim, **options):
        super().__init__(in_caps, in_dim, out_caps, out_dim, **options)
        dtype = tc.get_default_dtype()
        self.route_weight = _parameter((in_caps, out_caps, in_dim), dtype)
        self.route_bias = _parameter((in_caps, out_caps), dtype)

    @classmethod
    def extra_parameter_count(cls, in_caps, in_dim, out_caps, out_dim) -> int:
        return in_caps * out_caps * in_dim + in_caps * out_caps  # route_weight, route_bias

    def route_votes(self, u_hat, u, activations, trace):
        return Routed(*self_routing(u_hat, u, self.input_activations(u, activations), self.route_weight,
                                    self.route_bias, trace=trace))
