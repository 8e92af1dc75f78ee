"""The network family: CapsNet, its layers, routing and routing traces, decoders, losses, training
recipes (``recipes.py``), the baseline CNN and their configs. Imports nothing from ``analysis`` or ``app``.

``routing/`` is the routing: one module per algorithm (``dynamic``, ``uniform``, ``em``,
``self_attention``, ``self_routing``), each with its layer, the layer interface (``base``) and the
registry of routings by name (``registry``); ``trace.py`` is the RoutingTrace they all fill."""
from .baseline_cnn import BaselineCNN
from .config import (CONVENTIONS, MODEL_CONFIGS, MODEL_OPTIONS, BaselineCNNConfig, CapsNetConfig,
                     parse_hidden_capsules)
from .decoders import DECODERS, DeconvDecoder, FCDecoder, make_decoder
from .losses import (DEFAULT_RECONSTRUCTION_WEIGHT, capsule_loss, margin_loss, nll_loss, reconstruction_loss,
                     spread_loss)
from .recipes import RECIPES, Recipe
from .model import LENGTH_EPS, CapsNet, CapsNetOutput, CapsuleLayer, DigitCaps, PrimaryCaps, feature_map_sizes
from .routing import (GRADIENT_MODES, ROUTING_KINDS, Routed, RoutingLayer, dynamic_routing, em_routing, register_routing,
                      routing_names, routing_recipe, self_attention_routing, self_routing, uniform_routing,
                      unregister_routing)
from .trace import RoutingTrace

__all__ = ["BaselineCNN", "BaselineCNNConfig", "CONVENTIONS", "CapsNet", "CapsNetConfig", "CapsNetOutput",
           "CapsuleLayer", "DECODERS", "DEFAULT_RECONSTRUCTION_WEIGHT", "DeconvDecoder", "DigitCaps", "FCDecoder",
           "GRADIENT_MODES", "LENGTH_EPS", "MODEL_CONFIGS", "MODEL_OPTIONS", "PrimaryCaps", "RECIPES", "ROUTING_KINDS",
           "Recipe", "Routed", "RoutingLayer", "RoutingTrace", "capsule_loss", "dynamic_routing", "em_routing",
           "feature_map_sizes", "make_decoder", "margin_loss", "nll_loss", "parse_hidden_capsules",
           "reconstruction_loss", "register_routing", "routing_names", "routing_recipe", "self_attention_routing",
           "self_routing", "spread_loss", "uniform_routing", "unregister_routing"]
