"""Size checks made before allocating: will a CapsNet (and one training batch) fit in memory?

The estimate counts the parameters of every layer (their own counts, ``CapsNet.parameter_count``),
with their gradients and Adam's two moments, plus the largest activations of one batch (the im2col columns of
both convolutions and the routing predictions u_hat). It is a lower bound, good enough to refuse a
model that cannot fit (``--conv1-channels 1000000000``) before NumPy tries to allocate it.
"""
from __future__ import annotations

import os

import numpy as np

from tinygrad_caps.data.idx import meminfo_available_bytes

from ...capsnet.config import CapsNetConfig
from ...capsnet.model import CapsNet, feature_map_sizes
from .config import GEOMETRY_KEYS
from ...errors import UsageError

GIB = 1024 ** 3
CAPSNET_DEFAULTS = CapsNetConfig().to_dict()


def _with_defaults(config: dict) -> dict:
    return {**CAPSNET_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}


def capsnet_geometry(config: dict) -> dict:
    """Feature-map sizes of a CapsNet config: conv1_size, primary_size and num_primary capsules.

    Raises UsageError when the image is too small for the two convolutions.
    """
    config = _with_defaults(config)
    size, k = config["image_size"], config["kernel_size"]
    conv1_size, primary_size = feature_map_sizes(size, k)
    if conv1_size < 1 or primary_size < 1:
        raise UsageError(f"{size}x{size} images are too small for two {k}x{k} convolutions "
                         f"(--kernel-size {k}); use a kernel size of at most {max(1, (size + 1) // 2)}")
    return {"conv1_size": conv1_size, "primary_size": primary_size,
            "num_primary": config["primary_types"] * primary_size * primary_size}


def capsnet_parameter_count(config: dict) -> int:
    """The number of parameters of CapsNet(**config), from the model's layers (``CapsNet.parameter_count``)."""
    capsnet_geometry(config)  # the image must hold both convolutions: a UsageError saying so
    config = _with_defaults(config)
    return CapsNet.parameter_count({k: config[k] for k in CapsNetConfig.option_keys() + GEOMETRY_KEYS})


def training_bytes(config: dict, batch_size: int, dtype="float32", training: bool = True) -> int:
    """A lower bound on the bytes one step needs: parameters (with gradients and Adam's moments when
    ``training``) and the largest activations of a batch."""
    config = _with_defaults(config)
    itemsize = np.dtype(dtype).itemsize
    geometry = capsnet_geometry(config)
    c1, k, c = config["conv1_channels"], config["kernel_size"], config["in_channels"]
    s1, s2 = geometry["conv1_size"], geometry["primary_size"]
    u_hat = geometry["num_primary"] * max([config["num_classes"] * config["digit_dim"]]
                                          + [caps * dim for caps, dim in config.get("hidden_capsules") or ()])
    activations = batch_size * (s1 * s1 * (c * k * k + 2 * c1) + s2 * s2 * c1 * k * k + 2 * u_hat)
    return itemsize * ((4 if training else 1) * capsnet_parameter_count(config) + activations)


def available_bytes():
    """Memory a new allocation can still get (MemAvailable plus free swap), or None where unknown."""
    available = meminfo_available_bytes()
    if available is not None:
        return available
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(config: dict, batch_size: int, dtype="float32", what="this model", training: bool = True) -> None:
    """Raise UsageError, saying how much is needed, if training (or evaluating) ``config`` cannot fit in memory."""
    needed = training_bytes(config, batch_size, dtype, training)
    available = available_bytes()
    if available is not None and needed > available:
        params = capsnet_parameter_count(config)
        raise UsageError(f"{what} cannot fit: {params:,} parameters and a batch of {batch_size} need at least "
                         f"{needed / GIB:,.1f} GiB, and {available / GIB:,.1f} GiB of memory is available; "
                         "use smaller model options or --batch-size")
