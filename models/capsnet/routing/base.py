"""The interface every routing layer implements: ``RoutingLayer``, and ``Routed``, what it returns.

A routing layer is a module that maps the input capsules u (B, I, K) to output capsules (B, J, D)
through votes u_hat = W u (weight (I, J, D, K)) and a routing algorithm. A subclass writes
``route_votes`` and declares whether it is ``iterative`` (iterative algorithms take
``gradient="full"|"detach"``; the others take "full" and refuse "detach" in one line). Every layer
returns the same kind of RoutingTrace (``capsnet/trace.py``), so routing statistics, gradient-flow
reports, ``train --log-gradflow``, ``plot`` and studies work on all of them. The built-in layers
live beside their algorithms (``dynamic.CapsuleLayer``, ``em.EMRoutingLayer``, ...); the registry
of names is ``registry.py``.

Input activations (EM routing, self-routing) are those of the layer below when it has them, else
the lengths of the input capsules (the squashed primary capsules: sqrt(|u|^2 + 1e-8)).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps import functional as F
from tinygrad_caps import nn

from .common import GRADIENT_MODES

LENGTH_EPS = 1e-8


class Routed(NamedTuple):
    """What ``RoutingLayer.route`` returns: the output capsules (B, J, D), their activations (B, J)
    or None (the algorithm has none: the lengths of the poses serve), and the RoutingTrace or None."""
    poses: tc.Tensor
    activations: tc.Tensor | None = None
    trace: object = None


def capsule_lengths(u):
    """sqrt(|u|^2 + 1e-8) over the last axis: the lengths the model reads as activations."""
    return F.sqrt(F.sum(u * u, axis=-1) + LENGTH_EPS)


def _parameter(shape, dtype):
    return nn.Parameter(np.zeros(shape, dtype=dtype), device="cpu")


# The gradient-mode checks: every layer, the registry, the gradient-flow report, the gradflow command
# and a training run ask these, so each refusal has one text.

def unknown_mode_refusal(mode: str, argument: str | None = None):
    """Why ``mode`` is no routing-gradient mode at all (one line), or None for "full" and "detach":
    as a command-line value is refused ("unknown mode 'x'; choose from full, detach"), or, given the
    name of the Python ``argument`` that holds it, as an argument is ("gradient must be one of
    ('full', 'detach'), got 'x'")."""
    if mode in GRADIENT_MODES:
        return None
    if argument is not None:
        return f"{argument} must be one of {GRADIENT_MODES}, got {mode!r}"
    return f"unknown mode {mode!r}; choose from {', '.join(GRADIENT_MODES)}"


def gradient_mode_refusal(name: str, gradient: str, modes: tuple):
    """Why routing ``name``, which takes the gradient ``modes``, refuses ``gradient`` (one line), or None."""
    if gradient in modes:
        return None
    if gradient in GRADIENT_MODES:
        return f"routing {name!r} is not iterative: it has no {gradient!r} gradient mode (only {', '.join(modes)})"
    return unknown_mode_refusal(gradient, "gradient")


def layer_modes(layer) -> tuple:
    """The gradient modes ``layer`` takes: its ``gradient_modes`` (both modes where it has none)."""
    return getattr(layer, "gradient_modes", GRADIENT_MODES)


def supported_modes(layers) -> tuple:
    """The gradient modes (in ``GRADIENT_MODES``' order) that every one of the routing ``layers``
    takes: ("full",) as soon as one of them is not iterative."""
    layers = list(layers)
    return tuple(mode for mode in GRADIENT_MODES if all(mode in layer_modes(layer) for layer in layers))


def check_gradient_mode(layers, mode: str, who: str) -> None:
    """ValueError "``who``: <refusal>" in one line unless ``mode`` is a gradient mode that every one
    of the routing ``layers`` takes (``unknown_mode_refusal`` of the argument ``mode``, else
    ``gradient_mode_refusal`` of the first layer that refuses it)."""
    refusal = unknown_mode_refusal(mode, "mode")
    for layer in layers:
        refusal = refusal or gradient_mode_refusal(getattr(layer, "routing", "?"), mode, layer_modes(layer))
    if refusal:
        raise ValueError(f"{who}: {refusal}")


def other_mode_refusal(name: str, modes: tuple, who: str = "--log-mode-cosine"):
    """Why routing ``name``, whose layers take the gradient ``modes`` together, has no other mode to
    compare its own with (one line, starting with ``who``), or None where it has two."""
    if len(modes) >= 2:
        return None
    return (f"{who}: routing {name!r} is not iterative; it has one gradient mode, so there is no other mode to "
            "compare with")


class RoutingLayer(nn.Module):
    """A fully connected capsule layer: u_hat = W u for every (input, output) capsule pair, then a
    routing algorithm (``route_votes``, written by each subclass).

    Class attributes a subclass sets: ``iterative`` (False: one step, "detach" refused unless
    ``gradient_modes`` says otherwise), ``has_bias`` / ``has_leaky_routing`` (whether the layer
    takes the capsule bias (J, D) and the "none of the above" logit; refused otherwise); and what
    decides which recipe parts apply (``capsnet/recipes.py``): ``reads_activations`` (route_votes
    reads the input activations, so learned ones can replace the lengths), ``class_distribution``
    (its output activations sum to 1 over the outputs, so the NLL can read their log) and
    ``has_inverse_temperature`` (EM routing's lambda, and its cost scale and first assignments);
    ``kaiming_layout``: how SR-CapsNet lays out this routing's weight, for the fan-in of
    ``--capsule-init kaiming-uniform`` (``initialization.KAIMING_LAYOUTS``).
    Parameters: weight (I, J, D, K) ~ N(0, 0.01), and bias (J, D) (zero) where asked and taken.
    """

    iterative = True
    gradient_modes = GRADIENT_MODES
    has_bias = False
    has_leaky_routing = False
    reads_activations = False
    class_distribution = False
    has_inverse_temperature = False
    kaiming_layout = "vector"

    def __init__(self, in_caps, in_dim, out_caps, out_dim, *, routing=None, iterations=3, gradient="full",
                 bias=False, leaky_routing=False, squash=None):
        super().__init__()
        self.routing = routing or type(self).__name__
        self.gradient_modes = type(self).modes()
        if bias and not self.has_bias:
            raise ValueError(f"routing {self.routing!r} takes no capsule bias (--capsule-bias, --conventions official)")
        if leaky_routing and not self.has_leaky_routing:
            raise ValueError(f"routing {self.routing!r} takes no leaky routing (--leaky-routing)")
        self.iterations, self.leaky_routing, self.squash = iterations, leaky_routing, squash
        self.gradient = gradient
        dtype = tc.get_default_dtype()
        self.weight = _parameter((in_caps, out_caps, out_dim, in_dim), dtype)
        nn.init.normal_(self.weight, 0.0, 0.01)
        self.bias = _parameter((out_caps, out_dim), dtype) if bias else None

    @classmethod
    def parameter_count(cls, in_caps, in_dim, out_caps, out_dim, bias=False) -> int:
        """The number of parameters of a layer of this class: the weight (I, J, D, K), the bias (J, D)
        where asked, and ``extra_parameter_count``."""
        return (in_caps * out_caps * out_dim * in_dim + (out_caps * out_dim if bias else 0)
                + cls.extra_parameter_count(in_caps, in_dim, out_caps, out_dim))

    @classmethod
    def extra_parameter_count(cls, in_caps, in_dim, out_caps, out_dim) -> int:
        """The parameters a subclass adds to the weight and bias (none here)."""
        return 0

    @classmethod
    def modes(cls) -> tuple:
        """The gradient modes a layer of this class takes: ``gradient_modes``, except that a routing
        that is not iterative takes only "full" unless the class says otherwise."""
        if not cls.iterative and cls.gradient_modes is GRADIENT_MODES:
            return ("full",)
        return cls.gradient_modes

    @property
    def gradient(self) -> str:
        """The routing-gradient mode, one of ``gradient_modes`` (set it to switch)."""
        return self._gradient

    @gradient.setter
    def gradient(self, mode: str):
        refusal = gradient_mode_refusal(self.routing, mode, self.gradient_modes)
        if refusal:
            raise ValueError(refusal)
        object.__setattr__(self, "_gradient", mode)

    def route_votes(self, u_hat, u, activations, trace: bool) -> Routed:
        """Route the votes u_hat (B, I, J, D) of the input capsules u (B, I, K), whose activations
        are ``activations`` (B, I) or None; return Routed(poses, activations or None, RoutingTrace
        when ``trace`` else None) (a pair (poses, trace) is taken too)."""
        raise NotImplementedError

    def route(self, u, activations=None, trace: bool = False) -> Routed:
        """The layer on input capsules u (B, I, K) with activations (B, I) or None: a Routed."""
        routed = self.route_votes(F.capsule_predict(u, self.weight), u, activations, trace)
        if not isinstance(routed, Routed):
            routed = Routed(routed[0], None, routed[1]) if len(routed) == 2 else Routed(*routed)
        if trace and routed.trace is None:
            raise ValueError(f"routing {self.routing!r}: route_votes was asked for a trace and returned none")
        if routed.trace is not None:
            routed.trace.routing = self.routing  # the registered name, also for a class registered twice
        return routed

    def forward(self, u, return_coupling=False, return_trace=False, activations=None):
        """u (B, I, K) -> v (B, J, D); with ``return_coupling`` (v, [c per iteration]), with
        ``return_trace`` (v, RoutingTrace), with both (v, [c, ...], RoutingTrace)."""
        routed = self.route(u, activations, trace=return_coupling or return_trace)
        extras = ([list(routed.trace.coupling)] if return_coupling else []) + ([routed.trace] if return_trace else [])
        return (routed.poses, *extras) if extras else routed.poses

    def input_activations(self, u, activations):
        """``activations`` when the layer below gave them, else the lengths of u."""
        return capsule_lengths(u) if activations is None else activations
