"""Layers with PyTorch's parameter shapes and default initialization."""
from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from ..tensor import get_default_dtype
from . import init
from .module import Module, Parameter


def _uniform_parameter(shape, bound):
    p = Parameter(np.zeros(shape, dtype=get_default_dtype()), device="cpu")
    return init.uniform_(p, -bound, bound)


class Linear(Module):
    """y = x @ weight.T + bias; weight (out_features, in_features), bias (out_features,)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.weight = _uniform_parameter((out_features, in_features), bound)
        self.bias = _uniform_parameter((out_features,), bound) if bias else None

    @staticmethod
    def parameter_count(in_features: int, out_features: int, bias: bool = True) -> int:
        """The number of values of the weight and bias ``Linear(in_features, out_features, bias)`` makes."""
        return out_features * in_features + (out_features if bias else 0)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Conv2d(Module):
    """2-D convolution; weight (out_channels, in_channels, kh, kw), bias (out_channels,)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True):
        super().__init__()
        kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, (kh, kw)
        self.stride, self.padding = stride, padding
        bound = 1.0 / math.sqrt(in_channels * kh * kw)
        self.weight = _uniform_parameter((out_channels, in_channels, kh, kw), bound)
        self.bias = _uniform_parameter((out_channels,), bound) if bias else None

    @staticmethod
    def parameter_count(in_channels: int, out_channels: int, kernel_size, bias: bool = True) -> int:
        """The number of values of the weight and bias this layer makes (a transposed one: the same)."""
        kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
        return out_channels * in_channels * kh * kw + (out_channels if bias else 0)

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class ConvTranspose2d(Module):
    """Transposed 2-D convolution; weight (in_channels, out_channels, kh, kw), bias (out_channels,)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, bias=True):
        super().__init__()
        kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, (kh, kw)
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        bound = 1.0 / math.sqrt(out_channels * kh * kw)  # PyTorch's fan_in for this weight layout
        self.weight = _uniform_parameter((in_channels, out_channels, kh, kw), bound)
        self.bias = _uniform_parameter((out_channels,), bound) if bias else None

    parameter_count = Conv2d.parameter_count

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, output_padding={self.output_padding}")


class _BatchNorm(Module):
    expected_ndim: tuple = ()

    @staticmethod
    def parameter_count(num_features: int, affine: bool = True) -> int:
        """The number of values of the weight and bias (affine) this layer makes; its running statistics
        are buffers, not parameters."""
        return 2 * num_features if affine else 0

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        dtype = get_default_dtype()
        self.weight = Parameter(np.ones(num_features, dtype), device="cpu") if affine else None
        self.bias = Parameter(np.zeros(num_features, dtype), device="cpu") if affine else None
        self.register_buffer("running_mean", np.zeros(num_features, dtype) if track_running_stats else None)
        self.register_buffer("running_var", np.ones(num_features, dtype) if track_running_stats else None)

    def forward(self, x):
        if x.ndim not in self.expected_ndim:
            raise ValueError(f"{type(self).__name__}: expected an input with {self.expected_ndim} dimensions, got {x.shape}")
        use_batch = self.training or self.running_mean is None
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=use_batch, momentum=self.momentum, eps=self.eps)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L) inputs."""

    expected_ndim = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm over (N, C, H, W) inputs."""

    expected_ndim = (4,)


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(x)


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class Dropout(Module):
    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)


class Flatten(Module):
    """(N, ...) -> (N, prod(...))."""

    def forward(self, x):
        return F.flatten(x, 1)


class Sequential(Module):
    """Modules applied in order; submodules are named "0", "1", ..."""

    def __init__(self, *modules: Module):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __len__(self):
        return len(self._modules)

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __iter__(self):
        return iter(self._modules.values())

    def forward(self, x):
        for m in self:
            x = m(x)
        return x
