"""Self-attention routing (Mazzia et al. 2021, Efficient-CapsNet's FCCaps layer), one step, from
engine ops, and its layer ``SelfAttentionRoutingLayer`` (routing "self-attention").

Votes are u_hat (B, I, J, D). With ``trace=True`` every use of u_hat enters through an identity
node of its own; the one-step trace holds logits = agreement = the scores a_ij, coupling =
softmax_j a_ij (without the learned bias), weighted = s, outputs = v; u_hat_sum = u_hat in the
weighted sum, u_hat_agreement = u_hat in the scores (both factors).
"""
from __future__ import annotations

import math

import tinygrad_caps as tc
from tinygrad_caps import functional as F

from ..squash import as_nonlinearity
from ..trace import RoutingTrace
from .base import RoutingLayer, Routed, _parameter
from .common import _check_shape, _check_votes, _identity


def self_attention_routing(u_hat, bias, squash="efficient", trace: bool = False):
    """Self-attention routing (Mazzia et al. 2021, Efficient-CapsNet's FCCaps layer), one step.

    a_ij = <u_hat_ij, sum_k u_hat_kj> / sqrt(D); c_ij = softmax over j of a_ij;
    s_j = sum_i (c_ij + bias_ij) u_hat_ij; v_j = squash(s_j).

    Args:
        u_hat: (B, I, J, D). bias: (I, J) Tensor (learnable in the layer, 0 at the start).
        squash: a name of ``squash.SQUASHES`` (its own eps: "efficient" is Mazzia et al.'s, eps
            1e-20) or a callable over the last axis.
        trace: also return a one-step RoutingTrace (mapping in the module docstring).
    Returns:
        v (B, J, D), plus the trace with ``trace``.
    """
    name = "self_attention_routing"
    _check_votes(name, u_hat)
    _check_shape(name, "bias", bias, u_hat.shape[1:3])
    attending = _identity(u_hat, trace)
    total = F.sum(attending, axis=1, keepdims=True)
    scores = F.sum(attending * total, axis=-1) / math.sqrt(u_hat.shape[-1])
    c = F.softmax(scores, axis=2)
    summed = _identity(u_hat, trace)
    s = F.routing_weighted_sum(c + bias, summed)
    v = as_nonlinearity(squash)(s)
    if not trace:
        return v
    record = RoutingTrace(gradient="full", dot_agreement=False, routing="self-attention")
    record.record(logits=scores, coupling=c, weighted=s, outputs=v, u_hat_sum=summed, agreement=scores,
                  u_hat_agreement=attending)
    return v, record


class SelfAttentionRoutingLayer(RoutingLayer):
    """Self-attention routing (``self_attention_routing``), one step: parameters weight and
    attention_bias (I, J) (zero at the start); the model's squash (Mazzia et al.'s is
    ``squash="efficient"``)."""

    iterative = False

    def __init__(self, in_caps, in_dim, out_caps, out_dim, **options):
        super().__init__(in_caps, in_dim, out_caps, out_dim, **options)
        self.attention_bias = _parameter((in_caps, out_caps), tc.get_default_dtype())

    @classmethod
    def extra_parameter_count(cls, in_caps, in_dim, out_caps, out_dim) -> int:
        return in_caps * out_caps  # attention_bias

    def route_votes(self, u_hat, u, activations, trace):
        routed = self_attention_routing(u_hat, self.attention_bias, self.squash, trace=trace)
        return Routed(routed[0], None, routed[1]) if trace else Routed(routed)
