"""How a CapsNet's routing layers start (``CapsNet(capsule_init=NAME)``), by name.

``CAPSULE_INITS`` maps each name to a function of the model's routing layers (``(name, layer)``
pairs, bottom to top) that redraws their weights and biases in place, after the rest of the
model is initialised (in the ``conventions``' way); the config's ``capsule_init`` option and
its CLI choices are derived from this table.

    "default"  the layers as the model built them: weights N(0, 0.01) and a zero ``capsule_bias``
               with the paper's conventions, the official code's values with ``conventions="official"``.
    "peer"     Peer et al.'s code (peerdavid/capsnet-limitations, ``capsule/capsule_layer.py``
               ``Capsule.__init__``): weights N(0, 0.2) (``stdev=0.2``) and every bias 0.1.
"""
from __future__ import annotations

from tinygrad_caps import nn

PEER_WEIGHT_STD = 0.2
PEER_BIAS = 0.1


def keep_initialization(routing_layers) -> None:
    """Leave the routing layers as the model built them."""


def peer_initialization(routing_layers) -> None:
    """Weights N(0, 0.2) and biases 0.1 in every routing layer, as Peer et al.'s code draws them."""
    for _, layer in routing_layers:
        nn.init.normal_(layer.weight, 0.0, PEER_WEIGHT_STD)
        if layer.bias is not None:
            nn.init.constant_(layer.bias, PEER_BIAS)


CAPSULE_INITS = {"default": keep_initialization, "peer": peer_initialization}
