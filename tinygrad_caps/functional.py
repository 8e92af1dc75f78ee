"""Every differentiable op of the engine as a plain function (``import tinygrad_caps.functional as F``).

Each op is one small Function class in ``tinygrad_caps.ops.<family>``; composite ops (mean,
squash, losses, batch_norm, linear, conv2d) are written from those primitives, so their
gradients of every order come from the engine.
"""
from .ops._common import broadcast_to, sum_to
from .ops.activation import leaky_relu, log_softmax, relu, sigmoid, softmax, squash, tanh
from .ops.capsule import capsule_predict, fused_routing_available, routing_agreement, routing_forward, routing_weighted_sum
from .ops.conv import col2im, conv2d, conv_output_size, conv_transpose2d, im2col
from .ops.identity import identity
from .ops.elementwise import abs, add, clip, div, exp, log, maximum, minimum, mul, neg, pow, sqrt, sub, where
from .ops.linalg import linear, matmul
from .ops.loss import binary_cross_entropy, cross_entropy, mse_loss, one_hot
from .ops.normalization import batch_norm, dropout
from .ops.reduce import max, mean, min, sum
from .ops.shape import (cast, concatenate, copy, expand_dims, flatten, getitem, pad, permute, reshape, squeeze, stack,
                        swapaxes, to_device, transpose)

__all__ = [
    "abs", "add", "batch_norm", "binary_cross_entropy", "broadcast_to", "capsule_predict", "cast", "clip", "col2im", "concatenate",
    "conv2d", "conv_output_size", "copy", "conv_transpose2d", "cross_entropy", "div", "dropout", "exp", "expand_dims",
    "flatten", "fused_routing_available", "getitem", "identity", "im2col", "leaky_relu", "linear", "log", "log_softmax", "matmul", "max", "maximum", "mean",
    "min", "minimum", "mse_loss", "mul", "neg", "one_hot", "pad", "permute", "pow", "relu", "reshape", "routing_agreement", "routing_forward", "routing_weighted_sum", "sigmoid",
    "softmax", "sqrt", "squash", "squeeze", "stack", "sub", "sum", "sum_to", "swapaxes", "tanh", "to_device",
    "transpose", "where",
]
