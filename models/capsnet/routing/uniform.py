"""Uniform routing, the no-routing baseline (Paik et al. 2019; Gu & Tresp 2020): c = 1/J, one
weighted sum and squash, from engine ops. It is the first iteration of ``dynamic.dynamic_routing``,
and its layer is ``dynamic.CapsuleLayer(routing="uniform")``. Trace: one step, logits 0, coupling
1/J, weighted = s, outputs = v, u_hat_sum = u_hat in the weighted sum; no agreement path.
"""
from __future__ import annotations

import tinygrad_caps as tc
from tinygrad_caps import functional as F

from ..squash import sabour_squash
from ..trace import RoutingTrace
from .common import _check_bias, _routing_result, weighted_sum


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
