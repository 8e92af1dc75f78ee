"""One CapsNet training step, written once for whoever times, measures or captures it (the
benchmarks, the CUDA-graph tests): forward, the model's loss (its recipe's: the capsule loss under
the common recipe), zero_grad, backward, Adam. The Trainer's own step adds traces and metric sums
around the same sequence."""
from __future__ import annotations

import tinygrad_caps as tc


def capsnet_training_step(model, images, labels, forward=None, lr: float = 1e-3, capturable: bool = False):
    """(optimizer, step): a new Adam over ``model``'s parameters and ``step()``, one training step on
    ``images`` (a Tensor, (B, C, H, W)) and ``labels`` ((B,) integers, an array), returning the loss
    Tensor (a scalar). ``forward`` runs the model (default ``model``; a DistributedDataParallel
    wrapping it, say); ``capturable``: an optimizer whose step a CUDA graph can capture. The step reads
    ``images`` and ``labels`` anew each call, so writing into them changes the batch (what a captured
    step relies on)."""
    optimizer = tc.optim.Adam(model.parameters(), lr=lr, capturable=capturable)
    forward = model if forward is None else forward

    def step():
        loss = model.loss(forward(images, labels), images, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return optimizer, step
