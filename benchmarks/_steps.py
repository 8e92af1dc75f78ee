"""The CapsNet training step the benchmarks time and measure (train_step.py, memory.py, scaling.py):
ours is the package's (``models/app/training/step.py``, which the CUDA-graph tests use too), PyTorch's
is written here.

Only NumPy and tinygrad_caps load with this module; CapsNet, the loss and PyTorch load when a step
is built, so that memory.py's PyTorch child (which draws its batch here) carries none of ours.
"""
from __future__ import annotations

import numpy as np

import tinygrad_caps as tc


# The models the GPU benchmarks run: the paper's CapsNet, the README's reduced one (the studies'
# default), and a tiny one for the CPU stand-in's smoke tests (10x10 images of 3 classes).
MODELS = {"full": {}, "reduced": {"conv1_channels": 64, "primary_types": 16},
          "tiny": {"conv1_channels": 4, "primary_types": 2, "primary_dim": 4, "digit_dim": 4, "kernel_size": 3,
                   "image_size": 10, "num_classes": 3}}


def random_batch(batch: int, seed: int = 0, image_size: int = 28, num_classes: int = 10):
    """(images (batch, 1, S, S) float32 in [0, 1), labels (batch,) int64 in 0..C-1), NumPy, from ``seed``
    (S = ``image_size``, C = ``num_classes``; the paper's 28 and 10 by default)."""
    rng = np.random.default_rng(seed)
    return rng.random((batch, 1, image_size, image_size), dtype=np.float32), rng.integers(0, num_classes, batch)


def model_batch(batch: int, options: dict, seed: int = 0):
    """``random_batch`` for a CapsNet built with ``options`` (one of MODELS): its image size and classes."""
    return random_batch(batch, seed, options.get("image_size", 28), options.get("num_classes", 10))


def seeded_capsnet(device=None, **options):
    """The paper's CapsNet (or ``CapsNet(**options)``), its weights drawn after ``tc.manual_seed(0)``
    (the same on every call), on ``device`` (None: where it was made, the CPU)."""
    from tinygrad_caps.models import CapsNet

    tc.manual_seed(0)
    model = CapsNet(**options)
    return model if device is None else model.to(device=device)


def training_step(model, images, labels, forward=None, lr: float = 1e-3, capturable: bool = False):
    """(optimizer, step): the package's one CapsNet training step (``capsnet_training_step``), for
    ``images`` (a Tensor) and ``labels`` (an array); see it for ``forward`` and ``capturable``."""
    from tinygrad_caps.models.app.training.step import capsnet_training_step

    return capsnet_training_step(model, images, labels, forward, lr, capturable)


def torch_training_step(model, images, labels, lr: float = 1e-3):
    """The same step for benchmarks/torch_capsnet.py's ``TorchCapsNet`` (whose forward returns the
    loss): ``step()`` on the torch tensors ``images`` and ``labels``, returning the loss."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def step():
        loss = model(images, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return step
