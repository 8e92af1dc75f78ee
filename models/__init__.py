"""CapsNet and its training tools, built on the engine; installed as ``tinygrad_caps.models``.

Three layers, each importing only those below it: ``capsnet`` (the network family), ``analysis``
(gradient flow, routing statistics, figures and pictures of models and arrays) and ``app`` (the
command line in ``app.cli``, a training run in ``app.training``, studies in ``app.studies``). ``cli``
is the command's entry point; the module paths from before a move still import, with a
DeprecationWarning naming the new one (``_moved``; CHANGELOG.md).
"""
from . import _moved
from .analysis.gradflow import gradient_flow_report
from .analysis.routing_statistics import routing_statistics
from .capsnet import (BaselineCNN, BaselineCNNConfig, CapsNet, CapsNetConfig, CapsNetOutput, CapsuleLayer,
                      DeconvDecoder, DigitCaps, FCDecoder, PrimaryCaps, Routed, RoutingLayer, RoutingTrace, capsule_loss,
                      dynamic_routing, em_routing, make_decoder, margin_loss, reconstruction_loss, register_routing,
                      routing_names, self_attention_routing, self_routing, uniform_routing, unregister_routing)
from .app.training.config import TrainingConfig

_moved.install(__name__)

__all__ = ["BaselineCNN", "BaselineCNNConfig", "CapsNet", "CapsNetConfig", "CapsNetOutput", "CapsuleLayer",
           "DeconvDecoder", "DigitCaps", "FCDecoder", "PrimaryCaps", "Routed", "RoutingLayer", "RoutingTrace",
           "capsule_loss", "dynamic_routing", "em_routing", "gradient_flow_report", "make_decoder", "margin_loss",
           "reconstruction_loss", "register_routing", "routing_names", "routing_statistics", "self_attention_routing",
           "self_routing", "TrainingConfig", "uniform_routing", "unregister_routing"]
