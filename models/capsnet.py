"""CapsNet (Sabour, Frosst & Hinton 2017): Conv1, PrimaryCaps, DigitCaps with dynamic routing,
and a reconstruction decoder. Sizes derive from the arguments; the defaults are the paper's."""
from __future__ import annotations

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps import functional as F
from tinygrad_caps import nn

from .decoders import make_decoder
from .routing import dynamic_routing

LENGTH_EPS = 1e-8


class PrimaryCaps(nn.Module):
    """A convolution whose channels are ``types`` capsule types of ``dim`` values each.

    Channel ``c = type * dim + component``. The (B, types*dim, H, W) map becomes (B, types, dim,
    H, W), is permuted to (B, types, H, W, dim) so that one capsule's components stay together,
    then flattened to (B, types*H*W, dim) and squashed.
    """

    def __init__(self, in_channels, types, dim, kernel_size, stride=2):
        super().__init__()
        self.types, self.dim, self.stride = types, dim, stride
        conv = nn.Conv2d(in_channels, types * dim, kernel_size)  # for PyTorch's default initialization
        self.weight, self.bias = conv.weight, conv.bias

    def forward(self, x):
        y = F.conv2d(x, self.weight, self.bias, stride=self.stride)
        batch, _, h, w = y.shape
        y = F.reshape(y, (batch, self.types, self.dim, h, w))
        y = F.permute(y, (0, 1, 3, 4, 2))
        return F.squash(F.reshape(y, (batch, self.types * h * w, self.dim)), axis=-1)


class DigitCaps(nn.Module):
    """u_hat = W u for every (input, output) capsule pair, then dynamic routing; weight (I, J, D, K)."""

    def __init__(self, in_caps, in_dim, out_caps, out_dim, iterations=3, gradient="full"):
        super().__init__()
        self.iterations, self.gradient = iterations, gradient
        self.weight = nn.Parameter(np.zeros((in_caps, out_caps, out_dim, in_dim), dtype=tc.get_default_dtype()))
        nn.init.normal_(self.weight, 0.0, 0.01)

    def forward(self, u, return_coupling=False):
        u_hat = F.capsule_predict(u, self.weight)
        return dynamic_routing(u_hat, self.iterations, self.gradient, return_coupling)


class CapsNet(nn.Module):
    """The CapsNet of the paper, with every size taken from the arguments.

    Parameters (shapes at the defaults): conv1.weight (256, C, 9, 9), conv1.bias, primary.weight
    (256, 256, 9, 9), primary.bias, digit.weight (1152, 10, 16, 8), decoder.fc1/fc2/fc3.weight
    (out, in) and .bias.
    """

    def __init__(self, in_channels=1, image_size=28, num_classes=10, routing_iterations=3, routing_gradient="full",
                 decoder="fc", conv1_channels=256, primary_types=32, primary_dim=8, digit_dim=16, kernel_size=9):
        super().__init__()
        self.config = dict(in_channels=in_channels, image_size=image_size, num_classes=num_classes,
                           routing_iterations=routing_iterations, routing_gradient=routing_gradient, decoder=decoder,
                           conv1_channels=conv1_channels, primary_types=primary_types, primary_dim=primary_dim,
                           digit_dim=digit_dim, kernel_size=kernel_size)
        conv1_size = image_size - kernel_size + 1
        primary_size = (conv1_size - kernel_size) // 2 + 1
        if conv1_size < 1 or primary_size < 1:
            raise ValueError(f"CapsNet: image_size {image_size} is too small for two {kernel_size}x{kernel_size} convolutions")
        self.num_primary = primary_types * primary_size * primary_size
        self.conv1 = nn.Conv2d(in_channels, conv1_channels, kernel_size)
        self.primary = PrimaryCaps(conv1_channels, primary_types, primary_dim, kernel_size, stride=2)
        self.digit = DigitCaps(self.num_primary, primary_dim, num_classes, digit_dim, routing_iterations, routing_gradient)
        self.decoder = make_decoder(decoder, num_classes * digit_dim, in_channels, image_size)

    @property
    def device(self) -> str:
        """The device the parameters live on ("cpu" or "cuda")."""
        return self.digit.weight.device

    def forward(self, x, y=None, return_coupling=False):
        """Classify and reconstruct.

        Args:
            x: (B, C, H, W) images. y: (B,) integer labels, or None.
        Returns:
            v (B, num_classes, digit_dim), lengths (B, num_classes) = sqrt(|v|^2 + 1e-8), and the
            reconstruction (B, C*H*W) from v masked by ``y`` when given, else by the longest capsule.
            With ``return_coupling``, also the routing coefficients of every iteration.
        """
        x = tc.as_tensor(x)
        dtype = self.digit.weight.dtype
        if x.dtype != dtype:
            x = x.astype(dtype)
        expected = (self.config["in_channels"], self.config["image_size"], self.config["image_size"])
        if x.ndim != 4 or x.shape[1:] != expected:
            raise ValueError(f"CapsNet: expected images (B, {', '.join(map(str, expected))}), got shape {x.shape}")
        u = self.primary(F.relu(self.conv1(x)))
        routed = self.digit(u, return_coupling)
        v, couplings = routed if return_coupling else (routed, None)
        lengths = F.sqrt(F.sum(v * v, axis=-1) + LENGTH_EPS)
        if y is None:
            chosen = lengths.xp.argmax(lengths.data, axis=1)
        else:
            chosen = y.data if isinstance(y, tc.Tensor) else lengths.xp.asarray(np.asarray(y))
        mask = F.one_hot(chosen, self.config["num_classes"], dtype=dtype)
        reconstruction = self.decoder(F.reshape(v * F.expand_dims(mask, -1), (x.shape[0], -1)))
        if return_coupling:
            return v, lengths, reconstruction, couplings
        return v, lengths, reconstruction
