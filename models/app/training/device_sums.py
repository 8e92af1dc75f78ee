"""The running sums of an epoch's training metrics, kept where the model computes.

On a GPU the loss, the margin and reconstruction terms and the correct predictions of each batch
are added into one small array on the device, by kernels (which a CUDA graph replays), and read by
the host only when the trainer flushes them: at a logging interval, before a checkpoint, at the
epoch's end. On the CPU the trainer flushes after every batch, which is what it always did.
"""
from __future__ import annotations

import math

import numpy as np

import tinygrad_caps as tc

KEYS = ("loss", "margin_loss", "reconstruction_loss", "correct")


class DeviceSums:
    """Four float64 sums on ``device``: loss x batch size, margin and reconstruction terms, correct
    predictions (exact in float64 far beyond any dataset's size)."""

    def __init__(self, device: str):
        self.device = device
        with tc.backend.on_device(device):
            self.values = tc.backend.module_for(device).zeros(len(KEYS), dtype=np.float64)

    def add(self, loss, margin, reconstruction, predicted, labels, count: int) -> None:
        """Add one batch: ``loss`` (0-d mean), ``margin``/``reconstruction`` (per example), predicted
        and true classes (arrays on the device), ``count`` examples. Issues kernels only."""
        xp = tc.backend.array_module(self.values)
        with tc.backend.on_device(self.device):
            self.values[0] += loss.data.astype(np.float64) * count
            self.values[1] += margin.data.sum(dtype=np.float64)
            self.values[2] += reconstruction.data.sum(dtype=np.float64)
            self.values[3] += xp.count_nonzero(predicted == labels)

    def flush(self, sums: dict) -> bool:
        """Add what was gathered into the host's ``sums`` and start again from zero; returns
        whether every value was finite. One transfer from the device."""
        with tc.backend.on_device(self.device):
            gathered = tc.backend.to_numpy(self.values).copy()
            self.values.fill(0)
        for key, value in zip(KEYS, gathered.tolist()):
            sums[key] += int(round(value)) if key == "correct" else value
        return all(math.isfinite(v) for v in gathered.tolist())
