"""Learned input activations (``input_activations="learned"``): a sigmoid of a batch-normed
convolution beside PrimaryCaps, as SR-CapsNet trains self-routing and EM routing (their
``models/smallnet.py``: ``a = sigmoid(bn_a(conv_a(out)))``, ``conv_a`` without a bias).

The convolution reads conv1's feature map with PrimaryCaps' kernel and stride and gives one
channel per capsule type; its (B, types, H, W) map is flattened in PrimaryCaps' capsule order
(type, row, column), so activation k belongs to primary capsule k.
"""
from __future__ import annotations

from tinygrad_caps import functional as F
from tinygrad_caps import nn


class PrimaryActivations(nn.Module):
    """One activation in (0, 1) per primary capsule: sigmoid(BatchNorm2d(Conv2d(x))) flattened.

    Parameters: conv.weight (types, in_channels, k, k) (no bias: the batch norm's shift is one),
    norm.weight and norm.bias (types,), with the running statistics as buffers.
    """

    @staticmethod
    def parameter_count(in_channels: int, types: int, kernel_size: int) -> int:
        """The number of parameters of ``PrimaryActivations(in_channels, types, kernel_size)``."""
        return nn.Conv2d.parameter_count(in_channels, types, kernel_size, bias=False) + \
            nn.BatchNorm2d.parameter_count(types)

    def __init__(self, in_channels: int, types: int, kernel_size: int, stride: int = 2):
        super().__init__()
        self.types = types
        self.conv = nn.Conv2d(in_channels, types, kernel_size, stride=stride, bias=False)
        self.norm = nn.BatchNorm2d(types)

    def forward(self, x):
        """x: (B, in_channels, H, W) (conv1's map) -> (B, types * h * w) activations in (0, 1)."""
        if x.ndim != 4 or x.shape[1] != self.conv.in_channels:
            raise ValueError(f"PrimaryActivations: expected (B, {self.conv.in_channels}, H, W), got {x.shape}")
        a = F.sigmoid(self.norm(self.conv(x)))
        return F.reshape(a, (a.shape[0], -1))
