"""CapsNet and its training tools, built on the engine; installed as ``tinygrad_caps.models``."""
from .capsnet import CapsNet, DigitCaps, PrimaryCaps
from .decoders import DeconvDecoder, FCDecoder, make_decoder
from .losses import capsule_loss, margin_loss, reconstruction_loss
from .routing import dynamic_routing

__all__ = ["CapsNet", "DeconvDecoder", "DigitCaps", "FCDecoder", "PrimaryCaps", "capsule_loss", "dynamic_routing",
           "make_decoder", "margin_loss", "reconstruction_loss"]
