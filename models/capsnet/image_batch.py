"""The input check shared by the models: a batch of images of the geometry a model was built for."""
from __future__ import annotations

import tinygrad_caps as tc


def image_batch(x, config: dict, dtype, model: str):
    """``x`` as a Tensor of ``dtype`` (the model's parameters'), checked to be (B, in_channels,
    image_size, image_size) as in ``config``; ValueError naming ``model`` and the shape otherwise."""
    x = tc.as_tensor(x)
    if x.dtype != dtype:
        x = x.astype(dtype)
    expected = (config["in_channels"], config["image_size"], config["image_size"])
    if x.ndim != 4 or x.shape[1:] != expected:
        raise ValueError(f"{model}: expected images (B, {', '.join(map(str, expected))}), got shape {x.shape}")
    return x
