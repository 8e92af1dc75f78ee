"""Routing between capsule layers: one module per routing algorithm, the layer interface and the
registry of routings by name. Every public name of the modules is exported here.

    common.py          GRADIENT_MODES, the weighted sum, the checks the algorithms share
    base.py            RoutingLayer (the interface of every routing layer), Routed, capsule_lengths;
                       the gradient-mode checks everything asks: gradient_mode_refusal,
                       unknown_mode_refusal, layer_modes, supported_modes, check_gradient_mode,
                       other_mode_refusal
    uniform.py         uniform_routing, c = 1/J (the no-routing baseline)
    dynamic.py         dynamic routing (Sabour et al. 2017, Procedure 1): dynamic_routing,
                       routing_coupling; CapsuleLayer and DigitCaps, the layer of "dynamic" and "uniform"
    em.py              EM routing (Hinton et al. 2018) with vector poses: em_routing, its M- and
                       E-step, EMRoutingLayer
    self_attention.py  self-attention routing (Mazzia et al. 2021): self_attention_routing,
                       SelfAttentionRoutingLayer
    self_routing.py    self-routing (Hahn et al. 2019): self_routing, SelfRoutingLayer
    registry.py        register_routing, unregister_routing, routing_names, routing_layer,
                       routing_refusal, check_routing_layer, routing_recipe, routing_traits; the
                       built-in routings registered, with their authors' recipes

A module imports only modules above it in this list, and no algorithm imports another except that
``dynamic`` imports ``uniform`` (its CapsuleLayer runs both); tests/engine/test_layering_models.py
checks it. The RoutingTrace every algorithm fills is ``capsnet/trace.py``. The package's attribute
``self_routing`` is the function, which shares the module's name: the module itself is
``importlib.import_module("tinygrad_caps.models.capsnet.routing.self_routing")``, and
``from .routing.self_routing import NAME`` reads from it.
"""
from .base import (LENGTH_EPS, Routed, RoutingLayer, capsule_lengths, check_gradient_mode, gradient_mode_refusal,
                   layer_modes, other_mode_refusal, supported_modes, unknown_mode_refusal)
from .common import DEFAULT_EPS, GRADIENT_MODES, weighted_sum
from .dynamic import ROUTING_KINDS, CapsuleLayer, DigitCaps, dynamic_routing, routing_coupling
from .em import (EM_COST_SCALES, EM_INITIAL_ASSIGNMENTS, IBM_COST_SCALE, EMRoutingLayer, em_cost_scale,
                 em_log_likelihood, em_m_step, em_routing, inverse_temperatures, log_sigmoid)
from .registry import (AUTHORS_RECIPES, BUILTIN_ROUTINGS, ROUTING_LAYER_MEMBERS, check_routing_layer, register_routing,
                       routing_layer, routing_names, routing_parameter_count, routing_recipe, routing_refusal,
                       routing_traits, unregister_routing)
from .self_attention import SelfAttentionRoutingLayer, self_attention_routing
from .self_routing import SelfRoutingLayer, self_routing
from .uniform import uniform_routing

__all__ = ["AUTHORS_RECIPES", "BUILTIN_ROUTINGS", "CapsuleLayer", "DEFAULT_EPS", "DigitCaps", "EMRoutingLayer",
           "EM_COST_SCALES", "EM_INITIAL_ASSIGNMENTS", "GRADIENT_MODES", "IBM_COST_SCALE", "LENGTH_EPS",
           "ROUTING_KINDS", "ROUTING_LAYER_MEMBERS", "Routed", "RoutingLayer", "SelfAttentionRoutingLayer",
           "SelfRoutingLayer", "capsule_lengths", "check_gradient_mode", "check_routing_layer",
           "dynamic_routing", "em_cost_scale", "em_log_likelihood", "em_m_step", "em_routing",
           "gradient_mode_refusal", "inverse_temperatures", "layer_modes", "log_sigmoid",
           "other_mode_refusal", "register_routing", "routing_coupling", "routing_layer", "routing_names",
           "routing_parameter_count", "routing_recipe", "routing_refusal", "routing_traits",
           "self_attention_routing", "self_routing", "supported_modes", "uniform_routing",
           "unknown_mode_refusal", "unregister_routing", "weighted_sum"]
