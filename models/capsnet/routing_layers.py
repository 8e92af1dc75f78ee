"""Routing layers by name: one interface for every routing algorithm, and the registry that
``CapsNet(routing=NAME)``, ``--routing NAME``, checkpoints, presets and studies take names from.

A routing layer is a module that maps the input capsules u (B, I, K) to output capsules (B, J, D)
through votes u_hat = W u (weight (I, J, D, K)) and a routing algorithm. ``RoutingLayer`` is the
interface: a subclass writes ``route_votes`` and declares whether it is ``iterative`` (iterative
algorithms take ``gradient="full"|"detach"``; the others take "full" and refuse "detach" in one
line). Every layer returns the same kind of RoutingTrace (``trace.py``), so routing statistics,
gradient-flow reports, ``train --log-gradflow``, ``plot`` and studies work on all of them.

Built in (``routing_names()``):

    "dynamic"         Sabour et al. (2017), Procedure 1 (``routing.dynamic_routing``)
    "uniform"         c = 1/J, one weighted sum (``routing.uniform_routing``); one step, but "detach"
                      is accepted (it is the same computation) as it was before the registry
    "em"              EM routing, Hinton et al. (2018), vector poses (``routing_algorithms.em_routing``);
                      parameters beta_u, beta_a (J,) from 0; the output activations are the class scores
    "self-attention"  Mazzia et al. (2021), FCCaps (``routing_algorithms.self_attention_routing``);
                      parameter attention_bias (I, J) from 0; one step
    "self-routing"    Hahn et al. (2019) (``routing_algorithms.self_routing``); parameters
                      route_weight (I, J, K) and route_bias (I, J) from 0 (uniform routing at the
                      start); the output activations are the class scores; one step

Input activations (EM routing, self-routing) are those of the layer below when it has them, else
the lengths of the input capsules (the squashed primary capsules: sqrt(|u|^2 + 1e-8)).

Register your own with ``register_routing(name, layer_factory)``: ``layer_factory(in_caps, in_dim,
out_caps, out_dim, *, routing, iterations, gradient, bias, leaky_routing, squash)`` returns the
layer; a ``RoutingLayer`` subclass is such a factory (see docs/routing.md).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps import functional as F
from tinygrad_caps import nn

from .routing import GRADIENT_MODES, dynamic_routing, uniform_routing
from .routing_algorithms import em_routing, self_attention_routing, self_routing

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


class RoutingLayer(nn.Module):
    """A fully connected capsule layer: u_hat = W u for every (input, output) capsule pair, then a
    routing algorithm (``route_votes``, written by each subclass).

    Class attributes a subclass sets: ``iterative`` (False: one step, "detach" refused unless
    ``gradient_modes`` says otherwise), ``has_bias`` / ``has_leaky_routing`` (whether the layer
    takes the capsule bias (J, D) and the "none of the above" logit; refused otherwise).
    Parameters: weight (I, J, D, K) ~ N(0, 0.01), and bias (J, D) (zero) where asked and taken.
    """

    iterative = True
    gradient_modes = GRADIENT_MODES
    has_bias = False
    has_leaky_routing = False

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


class CapsuleLayer(RoutingLayer):
    """Dynamic routing (``routing="dynamic"``, Procedure 1; ``iterations`` and ``gradient`` apply) or
    uniform coupling (``routing="uniform"``, c = 1/J, one weighted sum). Parameters: weight (I, J, D,
    K) and, with ``bias``, bias (J, D) added to the weighted sum before the squash in every iteration
    (zero at initialization; see ``CapsNet``). ``leaky_routing`` adds the "none of the above" logit;
    ``squash`` is the nonlinearity (a function over the last axis; default Sabour et al.'s)."""

    has_bias = has_leaky_routing = True

    def __init__(self, in_caps, in_dim, out_caps, out_dim, iterations=3, gradient="full", routing="dynamic",
                 bias=False, leaky_routing=False, squash=None):
        if routing not in ("dynamic", "uniform"):
            raise ValueError(f"{type(self).__name__}: routing must be one of ('dynamic', 'uniform'), got {routing!r}")
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


class EMRoutingLayer(RoutingLayer):
    """EM routing (``routing_algorithms.em_routing``): parameters weight, beta_u and beta_a (J,) (zero
    at the start); ``inverse_temperature`` lambda, a float or one per iteration (default 1)."""

    def __init__(self, in_caps, in_dim, out_caps, out_dim, *, inverse_temperature=1.0, **options):
        super().__init__(in_caps, in_dim, out_caps, out_dim, **options)
        self.inverse_temperature = inverse_temperature
        dtype = tc.get_default_dtype()
        self.beta_u, self.beta_a = _parameter((out_caps,), dtype), _parameter((out_caps,), dtype)

    def route_votes(self, u_hat, u, activations, trace):
        return Routed(*em_routing(u_hat, self.input_activations(u, activations), self.beta_u, self.beta_a,
                                  self.iterations, self.inverse_temperature, self.gradient, trace=trace))


class SelfAttentionRoutingLayer(RoutingLayer):
    """Self-attention routing (``routing_algorithms.self_attention_routing``), one step: parameters
    weight and attention_bias (I, J) (zero at the start); the model's squash (Mazzia et al.'s is
    ``squash="efficient"``)."""

    iterative = False

    def __init__(self, in_caps, in_dim, out_caps, out_dim, **options):
        super().__init__(in_caps, in_dim, out_caps, out_dim, **options)
        self.attention_bias = _parameter((in_caps, out_caps), tc.get_default_dtype())

    def route_votes(self, u_hat, u, activations, trace):
        routed = self_attention_routing(u_hat, self.attention_bias, self.squash, trace=trace)
        return Routed(routed[0], None, routed[1]) if trace else Routed(routed)


class SelfRoutingLayer(RoutingLayer):
    """Self-routing (``routing_algorithms.self_routing``), one step: parameters weight, route_weight
    (I, J, K) and route_bias (I, J) (zero at the start: c = 1/J)."""

    iterative = False

    def __init__(self, in_caps, in_dim, out_caps, out_dim, **options):
        super().__init__(in_caps, in_dim, out_caps, out_dim, **options)
        dtype = tc.get_default_dtype()
        self.route_weight = _parameter((in_caps, out_caps, in_dim), dtype)
        self.route_bias = _parameter((in_caps, out_caps), dtype)

    def route_votes(self, u_hat, u, activations, trace):
        return Routed(*self_routing(u_hat, u, self.input_activations(u, activations), self.route_weight,
                                    self.route_bias, trace=trace))


# --- the registry ---

_ROUTINGS: dict = {}
BUILTIN_ROUTINGS = ("dynamic", "uniform", "em", "self-attention", "self-routing")


def register_routing(name: str, layer_factory, *, replace: bool = False):
    """Make ``name`` a routing of ``CapsNet(routing=name)``, ``--routing name``, checkpoints and
    studies. ``layer_factory(in_caps, in_dim, out_caps, out_dim, *, routing, iterations, gradient,
    bias, leaky_routing, squash)`` builds one routing layer (a ``RoutingLayer`` subclass is one).
    A name registered already is refused unless ``replace``; the built-in names are never replaced.
    Returns ``layer_factory``."""
    if not isinstance(name, str) or not name or not all(ch.isalnum() or ch in "-_." for ch in name):
        raise ValueError(f"register_routing: {name!r} is not a usable name (letters, digits, '-', '_', '.')")
    if not callable(layer_factory):
        raise TypeError(f"register_routing: the layer factory of {name!r} must be callable")
    if name in _ROUTINGS and (name in BUILTIN_ROUTINGS or not replace):
        raise ValueError(f"register_routing: a routing named {name!r} is registered already"
                         + ("" if name in BUILTIN_ROUTINGS else " (replace=True to replace it)"))
    _ROUTINGS[name] = layer_factory
    return layer_factory


def unregister_routing(name: str) -> None:
    """Forget a routing registered with ``register_routing`` (the built-in ones stay)."""
    if name in BUILTIN_ROUTINGS:
        raise ValueError(f"unregister_routing: {name!r} is built in")
    _ROUTINGS.pop(name, None)


def routing_names(builtin: bool = False) -> tuple:
    """The registered routing names, the built-in ones first (only those with ``builtin``)."""
    return BUILTIN_ROUTINGS if builtin else tuple(_ROUTINGS)


def gradient_mode_refusal(name: str, gradient: str, modes: tuple):
    """Why routing ``name``, which takes the gradient ``modes``, refuses ``gradient`` (one line), or None."""
    if gradient in modes:
        return None
    if gradient in GRADIENT_MODES:
        return f"routing {name!r} is not iterative: it has no {gradient!r} gradient mode (only {', '.join(modes)})"
    return f"gradient must be one of {GRADIENT_MODES}, got {gradient!r}"


def routing_refusal(name: str, gradient: str = "full", bias: bool = False, leaky_routing: bool = False):
    """Why a layer of routing ``name`` would refuse these options (one line), or None; read from the
    factory's class attributes where it is a ``RoutingLayer`` subclass (any other factory says so
    itself when called)."""
    factory = _ROUTINGS.get(name)
    if not (isinstance(factory, type) and issubclass(factory, RoutingLayer)) or factory is CapsuleLayer:
        return None
    refusal = gradient_mode_refusal(name, gradient, factory.modes())
    if refusal:
        return refusal
    if bias and not factory.has_bias:
        return f"routing {name!r} takes no capsule bias (--capsule-bias, --conventions official)"
    if leaky_routing and not factory.has_leaky_routing:
        return f"routing {name!r} takes no leaky routing (--leaky-routing)"
    return None


def routing_layer(name: str, in_caps, in_dim, out_caps, out_dim, **options):
    """A routing layer of the registered routing ``name`` (options as ``register_routing`` lists them);
    TypeError where its factory returns something that is not a ``RoutingLayer`` (``check_routing_layer``)."""
    if name not in _ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(_ROUTINGS)}, got {name!r} (register_routing adds one)")
    return check_routing_layer(name, _ROUTINGS[name](in_caps, in_dim, out_caps, out_dim, routing=name, **options))


# What a CapsNet uses of each routing layer: route() in its forward, weight and bias in its initialisations.
ROUTING_LAYER_MEMBERS = ("route", "weight", "bias")


def check_routing_layer(name: str, layer):
    """``layer`` if it is what the factory of routing ``name`` must return (a ``RoutingLayer``);
    else a TypeError naming the routing, what the factory returned and what that lacks."""
    if isinstance(layer, RoutingLayer):
        return layer
    advice = "the factory must return a RoutingLayer: subclass RoutingLayer and write route_votes (docs/routing.md)"
    if layer is None:
        raise TypeError(f"routing {name!r}: its layer factory returned None, not a layer; {advice}")
    lacks = [] if callable(getattr(layer, "route", None)) else ["route()"]
    lacks += [member for member in ROUTING_LAYER_MEMBERS[1:] if not hasattr(layer, member)]
    if not isinstance(layer, nn.Module):
        lacks.append("Module parameters")
    missing = f"it has no {', no '.join(lacks)}" if lacks else "it does not derive from RoutingLayer"
    raise TypeError(f"routing {name!r}: its layer factory returned a {type(layer).__module__}."
                    f"{type(layer).__qualname__}, not a RoutingLayer ({missing}); {advice}")


for _name, _factory in (("dynamic", CapsuleLayer), ("uniform", CapsuleLayer), ("em", EMRoutingLayer),
                        ("self-attention", SelfAttentionRoutingLayer), ("self-routing", SelfRoutingLayer)):
    register_routing(_name, _factory)
