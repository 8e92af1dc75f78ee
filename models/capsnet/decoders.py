"""Reconstruction decoders: the paper's fully connected one and a small transposed-conv one."""
from __future__ import annotations

import math
import numbers

from tinygrad_caps import functional as F
from tinygrad_caps import nn


FC_DECODER_HIDDEN = (512, 1024)  # the paper's hidden layers


class FCDecoder(nn.Module):
    """The paper's decoder: (B, num_caps*dim) -> hidden[0] -> hidden[1] -> C*H*W, ReLU, ReLU, sigmoid;
    ``hidden`` (CapsNetConfig.decoder_hidden) the paper's (512, 1024) by default."""

    HIDDEN = FC_DECODER_HIDDEN

    def __init__(self, in_features: int, out_pixels: int, hidden=HIDDEN):
        super().__init__()
        hidden = tuple(hidden)
        if len(hidden) != 2 or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1
                                       for n in hidden):
            raise ValueError(f"FCDecoder: hidden must be two positive unit counts (the paper's (512, 1024)), "
                             f"got {hidden!r}")
        hidden = tuple(int(n) for n in hidden)
        self.fc1 = nn.Linear(in_features, hidden[0])
        self.fc2 = nn.Linear(hidden[0], hidden[1])
        self.fc3 = nn.Linear(hidden[1], out_pixels)

    @classmethod
    def parameter_count(cls, in_features: int, out_pixels: int, hidden=HIDDEN) -> int:
        """The number of parameters of ``FCDecoder(in_features, out_pixels, hidden)``."""
        sizes = (in_features, *hidden, out_pixels)
        return sum(nn.Linear.parameter_count(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x):
        return F.sigmoid(self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))))


class DeconvDecoder(nn.Module):
    """FC to a (16, s, s) map with s = ceil(size/4), two stride-2 transposed convolutions to
    (32, 4s, 4s), a 3x3 convolution to C channels, a crop to (H, W) and a sigmoid. About 85% fewer
    parameters than the FC decoder at 28x28; ``batch_norm`` adds BatchNorm2d after each upsampling.
    """

    MAP, UP = 16, (64, 32)  # channels of the first map and of the two upsampled ones

    def __init__(self, in_features: int, channels: int, image_size: int, batch_norm: bool = False):
        super().__init__()
        self.channels, self.image_size = channels, image_size
        self.base = math.ceil(image_size / 4)
        self.fc = nn.Linear(in_features, self.MAP * self.base * self.base)
        self.deconv1 = nn.ConvTranspose2d(self.MAP, self.UP[0], 4, stride=2, padding=1)
        self.deconv2 = nn.ConvTranspose2d(self.UP[0], self.UP[1], 4, stride=2, padding=1)
        self.conv = nn.Conv2d(self.UP[1], channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(self.UP[0]) if batch_norm else None
        self.bn2 = nn.BatchNorm2d(self.UP[1]) if batch_norm else None

    @classmethod
    def parameter_count(cls, in_features: int, channels: int, image_size: int, batch_norm: bool = False) -> int:
        """The number of parameters of ``DeconvDecoder(in_features, channels, image_size, batch_norm)``."""
        base = math.ceil(image_size / 4)
        return (nn.Linear.parameter_count(in_features, cls.MAP * base * base)
                + nn.ConvTranspose2d.parameter_count(cls.MAP, cls.UP[0], 4)
                + nn.ConvTranspose2d.parameter_count(cls.UP[0], cls.UP[1], 4)
                + nn.Conv2d.parameter_count(cls.UP[1], channels, 3)
                + (nn.BatchNorm2d.parameter_count(cls.UP[0]) + nn.BatchNorm2d.parameter_count(cls.UP[1])
                   if batch_norm else 0))

    def forward(self, x):
        h = F.relu(self.fc(x))
        h = F.reshape(h, (x.shape[0], 16, self.base, self.base))
        h = self.deconv1(h)
        h = F.relu(self.bn1(h) if self.bn1 is not None else h)
        h = self.deconv2(h)
        h = F.relu(self.bn2(h) if self.bn2 is not None else h)
        h = self.conv(h)[:, :, :self.image_size, :self.image_size]
        return F.sigmoid(F.reshape(h, (x.shape[0], -1)))


DECODERS = ("fc", "deconv", "deconv-bn")


def decoder_parameter_count(kind: str, in_features: int, channels: int, image_size: int,
                            hidden=FC_DECODER_HIDDEN) -> int:
    """The number of parameters of ``make_decoder(kind, in_features, channels, image_size, hidden)``, from
    its layers' own counts (nothing is allocated)."""
    if kind == "fc":
        return FCDecoder.parameter_count(in_features, channels * image_size * image_size, hidden)
    if kind in ("deconv", "deconv-bn"):
        return DeconvDecoder.parameter_count(in_features, channels, image_size, batch_norm=kind == "deconv-bn")
    raise ValueError(f"unknown decoder {kind!r}; choose one of {DECODERS}")


def make_decoder(kind: str, in_features: int, channels: int, image_size: int,
                 hidden=FC_DECODER_HIDDEN) -> nn.Module:
    """"fc" (its two hidden layers of ``hidden`` units), "deconv" or "deconv-bn" (the transposed-conv
    decoder with batch norm): from (B, in_features) to (B, channels * image_size**2)."""
    if kind == "fc":
        return FCDecoder(in_features, channels * image_size * image_size, hidden)
    if kind in ("deconv", "deconv-bn"):
        return DeconvDecoder(in_features, channels, image_size, batch_norm=kind == "deconv-bn")
    raise ValueError(f"unknown decoder {kind!r}; choose one of {DECODERS}")
