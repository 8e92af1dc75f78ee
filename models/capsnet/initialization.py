"""How a CapsNet's routing layers start (``CapsNet(capsule_init=NAME)``), by name.

``CAPSULE_INITS`` maps each name to a function of the model's routing layers (``(name, layer)``
pairs, bottom to top) that redraws their weights and biases in place, after the rest of the
model is initialised (in the ``conventions``' way); the config's ``capsule_init`` option and
its CLI choices are derived from this table.

    "default"  the layers as the model built them: weights N(0, 0.01) and a zero ``capsule_bias``
               with the paper's conventions, the official code's values with ``conventions="official"``.
    "peer"     Peer et al.'s code (peerdavid/capsnet-limitations, ``capsule/capsule_layer.py``
               ``Capsule.__init__``): weights N(0, 0.2) (``stdev=0.2``) and every bias 0.1.
    "he-normal"  Efficient-CapsNet's (Mazzia et al. 2021, ``utils/layers.py`` ``FCCaps``: Keras'
               ``he_normal``): a normal truncated at 2 standard deviations, std sqrt(2 / fan_in) /
               0.8796 (Keras' correction for the truncation), fan_in Keras' for their W (J, I, K, D):
               I J K, all but the output pose size; in our layout (I, J, D, K) the product of all
               sizes but D. Biases as the model built them.
    "kaiming-uniform"  SR-CapsNet's (Hahn et al. 2019, ``modules.py``: PyTorch's
               ``kaiming_uniform_``): U(-b, b), b = sqrt(6 / fan_in), fan_in PyTorch's (size(1) times the
               sizes after it) for the layout of SR-CapsNet's weight of that routing
               (``KAIMING_LAYOUTS``; a layer's ``kaiming_layout``): "vector", SelfRouting2d's W1
               (kkA, J*D, K) (modules.py:233), fan_in J D K; "pose-matrix", EmRouting2d's W
               (kkA, J, 4, 4) (modules.py:92-93), fan_in J * 16 = J D, the pose's D = 16 values
               standing for their 4x4 matrix. Biases as the model built them.
"""
from __future__ import annotations

import math

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


# Keras' VarianceScaling(truncated_normal) divides by the standard deviation of a unit normal cut at +-2.
KERAS_TRUNCATION_STD = 0.87962566103423978


def he_normal_std(weight_shape) -> float:
    """The standard deviation (before the truncation) Keras' he_normal gives a routing weight (I, J, D, K):
    sqrt(2 / (I J K)) / 0.8796."""
    in_caps, out_caps, _, in_dim = weight_shape
    return math.sqrt(2.0 / (in_caps * out_caps * in_dim)) / KERAS_TRUNCATION_STD


KAIMING_LAYOUTS = ("vector", "pose-matrix")


def kaiming_uniform_fan_in(weight_shape, layout: str = "vector") -> int:
    """PyTorch's fan-in of SR-CapsNet's weight for a routing weight (I, J, D, K) in ``layout``:
    "vector" (W1 (I, J*D, K)): J D K; "pose-matrix" (EM's W (I, J, 4, 4), D = 16 pose values): J D."""
    _, out_caps, out_dim, in_dim = weight_shape
    if layout == "vector":
        return out_caps * out_dim * in_dim
    if layout == "pose-matrix":
        return out_caps * out_dim
    raise ValueError(f"kaiming_uniform_fan_in: layout must be one of {', '.join(KAIMING_LAYOUTS)}, got {layout!r}")


def kaiming_uniform_bound(weight_shape, layout: str = "vector") -> float:
    """The bound b = sqrt(6 / fan_in) of PyTorch's kaiming_uniform_ for a routing weight (I, J, D, K)
    laid out as SR-CapsNet's weight of ``layout`` (``kaiming_uniform_fan_in``): sqrt(6 / (J D K)) for
    "vector", sqrt(6 / (J D)) for "pose-matrix"."""
    return math.sqrt(6.0 / kaiming_uniform_fan_in(weight_shape, layout))


def he_normal_initialization(routing_layers) -> None:
    """Every routing layer's weight from Keras' he_normal, as Efficient-CapsNet's FCCaps draws it."""
    for _, layer in routing_layers:
        std = he_normal_std(layer.weight.shape)
        nn.init.trunc_normal_(layer.weight, 0.0, std, -2 * std, 2 * std)


def kaiming_uniform_initialization(routing_layers) -> None:
    """Every routing layer's weight from PyTorch's kaiming_uniform_, as SR-CapsNet draws its W, on the fan-in
    of the layer's ``kaiming_layout`` (SR-CapsNet's layout of that routing's weight)."""
    for _, layer in routing_layers:
        bound = kaiming_uniform_bound(layer.weight.shape, getattr(layer, "kaiming_layout", "vector"))
        nn.init.uniform_(layer.weight, -bound, bound)


CAPSULE_INITS = {"default": keep_initialization, "peer": peer_initialization, "he-normal": he_normal_initialization,
                 "kaiming-uniform": kaiming_uniform_initialization}
