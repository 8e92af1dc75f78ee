"""EM routing (Hinton, Sabour & Frosst 2018, Procedure 1) with vector poses, from engine ops, and its
layer ``EMRoutingLayer`` (routing "em").

Every line is a differentiable op, so the gradient through each iteration (and its second
derivatives) is derived by the engine. Votes are u_hat (B, I, J, D). With ``trace=True`` every use
of u_hat enters through an identity node of its own; the trace's fields, at iteration t: logits =
log a_j + log p_ij of the previous E-step (0 at t = 0), coupling = R (before the input activations
weigh it), weighted = outputs = mu (the poses), activations = a_j; u_hat_sum = u_hat as the M-step
uses it (mean and variance), u_hat_agreement and agreement = u_hat as the E-step uses it and log
p_ij (for t < iterations - 1, as in dynamic routing).
"""
from __future__ import annotations

import math
import numbers

import tinygrad_caps as tc
from tinygrad_caps import functional as F

from ..trace import RoutingTrace
from .base import RoutingLayer, Routed, _parameter
from .common import DEFAULT_EPS, GRADIENT_MODES, _check_shape, _check_votes, _identity

# How the cost is scaled: "none" (Hinton et al.'s Procedure 1; SR-CapsNet's code) or "ibm" (IBM's code,
# em_routing.py m_step, "layer_norm_factor": the cost times 100 / (I / J), so that a class layer, whose J
# outputs each hear many more inputs than a convolutional capsule layer's, sits in the same range of lambda).
EM_COST_SCALES = ("none", "ibm")
IBM_COST_SCALE = 100.0
# The first assignments R: "uniform" 1/J (Procedure 1; IBM's utils.init_rr) or "ones" (SR-CapsNet's
# modules.py EmRouting2d.forward, ``r = a_in.new_ones(...)``: the first M-step's mass m_j, and so its cost,
# J times the uniform one's; the means and variances are the same).
EM_INITIAL_ASSIGNMENTS = ("uniform", "ones")


def em_cost_scale(kind: str, in_caps: int, out_caps: int) -> float:
    """The factor on EM routing's cost for ``kind`` (``EM_COST_SCALES``) between ``in_caps`` input and
    ``out_caps`` output capsules: 1 for "none", 100 J / I for "ibm"."""
    if kind not in EM_COST_SCALES:
        raise ValueError(f"em_cost_scale: kind must be one of {', '.join(EM_COST_SCALES)}, got {kind!r}")
    return 1.0 if kind == "none" else IBM_COST_SCALE * out_caps / in_caps


def inverse_temperatures(inverse_temperature, iterations: int) -> list:
    """lambda per iteration: one float for all, or a sequence of ``iterations`` floats."""
    if isinstance(inverse_temperature, bool) or (
            not isinstance(inverse_temperature, numbers.Real)
            and any(isinstance(x, bool) for x in inverse_temperature)):
        raise ValueError(f"em_routing: inverse_temperature must be a number or one per iteration, "
                         f"got {inverse_temperature!r}")
    if isinstance(inverse_temperature, numbers.Real):
        values = [float(inverse_temperature)] * iterations
    else:
        values = [float(x) for x in inverse_temperature]
        if len(values) != iterations:
            raise ValueError(f"em_routing: inverse_temperature has {len(values)} values for {iterations} iterations")
    if not all(math.isfinite(x) for x in values):
        raise ValueError(f"em_routing: inverse_temperature must be finite, got {values}")
    return values


def log_sigmoid(z):
    """log(sigmoid(z)) without underflow: the second entry of log_softmax over (0, z)."""
    pair = F.stack([tc.zeros(z.shape, dtype=z.dtype, device=z.device), z], axis=-1)
    return F.getitem(F.log_softmax(pair, axis=-1), (Ellipsis, 1))


def em_m_step(coupling, activations, u_hat, beta_u, beta_a, inverse_temperature, eps=DEFAULT_EPS,
              cost_scale: float = 1.0):
    """One M-step of Procedure 1 (Hinton, Sabour & Frosst 2018) with vector poses.

    Args:
        coupling: R (B, I, J). activations: a_i (B, I). u_hat: (B, I, J, D). beta_u, beta_a: (J,).
        cost_scale: a factor on the cost (``em_cost_scale``; 1 in Procedure 1).
    Returns:
        (mu (B, J, D), var (B, J, D), the activation logit z = lambda (beta_a - cost) (B, J)); a_j = sigmoid(z).
    """
    weighted = coupling * F.expand_dims(activations, 2)                      # R' = R a_i
    mass = F.sum(weighted, axis=1)                                           # m_j (B, J)
    share = weighted / F.expand_dims(mass + eps, 1)                          # R'_ij / (m_j + eps)
    mu = F.routing_weighted_sum(share, u_hat)
    deviation = u_hat - F.expand_dims(mu, 1)
    var = F.routing_weighted_sum(share, deviation * deviation) + eps
    cost = (beta_u * u_hat.shape[-1] + 0.5 * F.sum(F.log(var), axis=-1)) * mass
    if cost_scale != 1.0:
        cost = cost * cost_scale
    return mu, var, inverse_temperature * (beta_a - cost)


def em_log_likelihood(u_hat, mu, var):
    """log p_ij = -sum_d [(u_hat - mu)^2 / (2 var) + 0.5 log(2 pi var)], (B, I, J)."""
    mu, var = F.expand_dims(mu, 1), F.expand_dims(var, 1)
    deviation = u_hat - mu
    return -F.sum(deviation * deviation / (2 * var) + 0.5 * F.log(2 * math.pi * var), axis=-1)


def em_routing(u_hat, activations, beta_u, beta_a, iterations: int = 3, inverse_temperature=1.0,
               gradient: str = "full", trace: bool = False, eps: float = DEFAULT_EPS, cost_scale: float = 1.0,
               initial_assignment: str = "uniform"):
    """EM routing (Hinton, Sabour & Frosst 2018, Procedure 1) with vector poses.

    R = 1/J; every iteration an M-step (means, variances, costs and activations of the J output
    capsules from R' = R a_i), then, before the last, an E-step R = softmax_j(log a_j + log p_ij).

    Args:
        u_hat: (B, I, J, D) votes. activations: (B, I) input activations in [0, 1] (not checked:
            that would read the device's values back to the host each step).
        beta_u, beta_a: (J,) Tensors (learnable in the layer).
        iterations: >= 1. inverse_temperature: lambda, a float or one per iteration.
        gradient: "full", or "detach": the R that reaches the last M-step passes no gradient (the
            earlier iterations see u_hat and the activations detached), so only the last M-step's
            dependence on u_hat, the activations and the betas is kept.
        trace: also return a RoutingTrace (mapping in the module docstring). eps: as in the formulas.
        cost_scale: a factor on every M-step's cost (``em_cost_scale``: 100 J / I in IBM's code).
        initial_assignment: the first R, "uniform" (1/J, Procedure 1) or "ones" (SR-CapsNet's code).
    Returns:
        (poses (B, J, D), out_activations (B, J)), plus the trace with ``trace``.
    """
    name = "em_routing"
    if iterations < 1:
        raise ValueError(f"{name}: iterations must be >= 1, got {iterations}")
    if gradient not in GRADIENT_MODES:
        raise ValueError(f"{name}: gradient must be one of {GRADIENT_MODES}, got {gradient!r}")
    _check_votes(name, u_hat)
    batch, inputs, outputs, _ = u_hat.shape
    _check_shape(name, "activations", activations, (batch, inputs))
    _check_shape(name, "beta_u", beta_u, (outputs,))
    _check_shape(name, "beta_a", beta_a, (outputs,))
    if initial_assignment not in EM_INITIAL_ASSIGNMENTS:
        raise ValueError(f"{name}: initial_assignment must be one of {', '.join(EM_INITIAL_ASSIGNMENTS)}, got "
                         f"{initial_assignment!r}")
    if isinstance(cost_scale, bool) or not isinstance(cost_scale, numbers.Real) or not (
            math.isfinite(cost_scale) and cost_scale > 0):
        raise ValueError(f"{name}: cost_scale must be a finite number > 0, got {cost_scale!r}")
    lambdas = inverse_temperatures(inverse_temperature, iterations)
    detach = gradient == "detach"
    frozen_votes = u_hat.detach() if detach else u_hat
    frozen_activations = activations.detach() if detach else activations
    logits = tc.zeros((batch, inputs, outputs), dtype=u_hat.dtype, device=u_hat.device)
    first = 1.0 / outputs if initial_assignment == "uniform" else 1.0
    coupling = tc.full((batch, inputs, outputs), first, dtype=u_hat.dtype, device=u_hat.device)
    record = RoutingTrace(gradient=gradient, dot_agreement=False, routing="em") if trace else None
    for t in range(iterations):
        with tc.graph.scope(f"{tc.graph.ROUTING_SCOPE} {t + 1}"):
            last = t == iterations - 1
            votes = u_hat if last else frozen_votes
            inputs_a = activations if last else frozen_activations
            if last and detach:
                coupling = coupling.detach()
            summed = _identity(votes, trace)
            mu, var, z = em_m_step(coupling, inputs_a, summed, beta_u, beta_a, lambdas[t], eps, cost_scale)
            out_activations = F.sigmoid(z)
            if trace:
                record.record(logits=logits, coupling=coupling, weighted=mu, outputs=mu, activations=out_activations,
                              u_hat_sum=summed)
            if not last:
                agreeing = _identity(votes, trace)
                log_p = em_log_likelihood(agreeing, mu, var)
                logits = F.expand_dims(log_sigmoid(z), 1) + log_p
                coupling = F.softmax(logits, axis=2)
                if trace:
                    record.record(agreement=log_p, u_hat_agreement=agreeing)
    return (mu, out_activations, record) if trace else (mu, out_activations)


class EMRoutingLayer(RoutingLayer):
    """EM routing (``em_routing``): parameters weight, beta_u and beta_a (J,) (zero at the start);
    ``inverse_temperature`` lambda, a float or one per iteration (1.0 when the layer is built alone,
    as ``em_routing``'s; a CapsNet sets its ``em_inverse_temperature``: 1e-3 under the common recipe,
    Hinton et al.'s schedule 0.01 (1 - 0.95^(r+1)) under the authors'); ``cost_scale`` (``EM_COST_SCALES``)
    and ``initial_assignment`` (``EM_INITIAL_ASSIGNMENTS``) as ``em_routing`` takes them ("none" and
    "uniform": Procedure 1). It reads the input activations; its output activations are the class scores."""

    reads_activations = True
    has_inverse_temperature = True
    kaiming_layout = "pose-matrix"  # SR-CapsNet's EmRouting2d W (kkA, J, 4, 4): kaiming-uniform's fan-in J * 16

    def __init__(self, in_caps, in_dim, out_caps, out_dim, *, inverse_temperature=1.0, cost_scale: str = "none",
                 initial_assignment: str = "uniform", **options):
        super().__init__(in_caps, in_dim, out_caps, out_dim, **options)
        self.inverse_temperature = inverse_temperature
        self.set_em_options(cost_scale, initial_assignment)
        dtype = tc.get_default_dtype()
        self.beta_u, self.beta_a = _parameter((out_caps,), dtype), _parameter((out_caps,), dtype)

    def set_em_options(self, cost_scale: str, initial_assignment: str) -> None:
        """Use the cost scale ``cost_scale`` (``EM_COST_SCALES``) and first assignments
        ``initial_assignment`` (``EM_INITIAL_ASSIGNMENTS``); ValueError for another value."""
        in_caps, out_caps = self.weight.shape[:2]
        factor = em_cost_scale(cost_scale, in_caps, out_caps)
        if initial_assignment not in EM_INITIAL_ASSIGNMENTS:
            raise ValueError(f"EMRoutingLayer: initial_assignment must be one of {', '.join(EM_INITIAL_ASSIGNMENTS)}, "
                             f"got {initial_assignment!r}")
        self.cost_scale, self.cost_factor, self.initial_assignment = cost_scale, factor, initial_assignment

    @classmethod
    def extra_parameter_count(cls, in_caps, in_dim, out_caps, out_dim) -> int:
        return 2 * out_caps  # beta_u, beta_a

    def route_votes(self, u_hat, u, activations, trace):
        return Routed(*em_routing(u_hat, self.input_activations(u, activations), self.beta_u, self.beta_a,
                                  self.iterations, self.inverse_temperature, self.gradient, trace=trace,
                                  cost_scale=self.cost_factor, initial_assignment=self.initial_assignment))
