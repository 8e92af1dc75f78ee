"""CapsNet and its training tools, built on the engine; installed as ``tinygrad_caps.models``."""
from .baseline_cnn import BaselineCNN
from .capsnet import CapsNet, CapsuleLayer, DigitCaps, PrimaryCaps
from .decoders import DeconvDecoder, FCDecoder, make_decoder
from .losses import capsule_loss, margin_loss, reconstruction_loss
from .routing import dynamic_routing, uniform_routing
from .gradflow import gradient_flow_report
from .routing_statistics import routing_statistics
from .trace import RoutingTrace

__all__ = ["BaselineCNN", "CapsNet", "CapsuleLayer", "DeconvDecoder", "DigitCaps", "FCDecoder", "PrimaryCaps", "RoutingTrace",
           "capsule_loss", "dynamic_routing", "gradient_flow_report", "make_decoder", "margin_loss", "reconstruction_loss", "routing_statistics",
           "uniform_routing"]
