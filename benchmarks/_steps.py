"""The CapsNet training step the benchmarks time and measure (train_step.py, memory.py, scaling.py):
ours is the package's (``models/app/training/step.py``, which the CUDA-graph tests use too), PyTorch's
is written here.

Only NumPy and tinygrad_caps load with this module; CapsNet, the loss and PyTorch load when a step
is built, so that memory.py's PyTorch child (which draws its batch here) carries none of ours.
"""
from __future__ import annotations

import numpy as np

import tinygrad_caps as tc


def random_batch(batch: int, seed: int = 0):
    """(images (batch, 1, 28, 28) float32 in [0, 1), labels (batch,) int64 in 0..9), NumPy, from ``seed``."""
    rng = np.random.default_rng(seed)
    return rng.random((batch, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, batch)


def seeded_capsnet(device=None):
    """The paper's CapsNet, its weights drawn after ``tc.manual_seed(0)`` (the same on every call), on
    ``device`` (None: where it was made, the CPU)."""
    from tinygrad_caps.models import CapsNet

    tc.manual_seed(0)
    model = CapsNet()
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
