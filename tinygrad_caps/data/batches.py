"""Seeded batches of a dataset with optional shift/flip augmentation."""
from __future__ import annotations

import numpy as np

AUGMENTATIONS = (None, "none", "shift", "shift+flip")


def shift_images(images: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """Translate each (C, H, W) image by its (dy, dx) with zero fill; images (N, C, H, W)."""
    out = np.zeros_like(images)
    h, w = images.shape[2:]
    for k, (dy, dx) in enumerate(shifts):
        ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
        xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
        out[k, :, yd, xd] = images[k, :, ys, xs]
    return out


class BatchIterator:
    """Batches of (float32 images in [0, 1] (B, C, H, W), int64 labels (B,)).

    Shuffling and augmentation are drawn from a generator seeded by (seed, epoch, batch index),
    so any epoch and any batch can be reproduced exactly, after a resume too. ``augment`` is
    None, "shift" (random shift up to ``max_shift`` pixels, zero padding, as in the paper) or
    "shift+flip" (also a horizontal flip with probability 1/2). Use it for training data only.
    ``preprocess`` (a ``Preprocess``, e.g. a ``DatasetSpec``'s train or test one) replaces the
    division by 255: it turns the uint8 batch into the model's float32 input (N, C, S, S), its
    random crops and jitter drawn from (seed, epoch, batch index) too.

    ``shard=(rank, world_size)`` is for data-parallel training: ``batch_size`` is the global batch
    (a multiple of ``world_size``); every rank draws the same (seed, epoch) order and
    augmentation and yields its contiguous slice of each global batch, so the slices of all
    ranks together are exactly the single-process batch. A last global batch with fewer
    examples than ranks is skipped (each rank needs at least one example).
    """

    def __init__(self, images, labels, batch_size: int, shuffle: bool = False, augment=None, seed: int = 0,
                 max_shift: int = 2, drop_last: bool = False, shard=(0, 1), preprocess=None):
        if batch_size < 1:
            raise ValueError(f"BatchIterator: batch_size must be positive, got {batch_size}")
        self.rank, self.world_size = _check_shard(shard, batch_size)
        if augment not in AUGMENTATIONS:
            raise ValueError(f"BatchIterator: augment must be one of {AUGMENTATIONS}, got {augment!r}")
        if len(images) != len(labels):
            raise ValueError(f"BatchIterator: {len(images)} images but {len(labels)} labels")
        self.images, self.labels = images, labels
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.augment = None if augment == "none" else augment
        self.max_shift, self.drop_last = max_shift, drop_last
        self.preprocess = preprocess
        self.epoch = 0

    def __len__(self):
        n = len(self.images)
        full, rest = divmod(n, self.batch_size)
        return full + (0 < rest and not self.drop_last and rest >= self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle and augmentation the next iteration reproduces."""
        self.epoch = epoch

    def order(self) -> np.ndarray:
        n = len(self.images)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, self.epoch]).permutation(n)

    def batches(self, start: int = 0):
        """Yield batches ``start``, ``start + 1``, ... of the current epoch."""
        order = self.order()
        for index in range(start, len(self)):
            picked = order[index * self.batch_size:(index + 1) * self.batch_size]
            mine = self.shard_slice(len(picked))
            images = self.images[picked[mine]]
            if self.augment:  # drawn for the whole global batch, so a rank's slice matches one process's
                rng = np.random.default_rng([self.seed, self.epoch, index, 1])
                shifts = rng.integers(-self.max_shift, self.max_shift + 1, size=(len(picked), 2))
                images = shift_images(images, shifts[mine])
                if self.augment == "shift+flip":
                    flip = (rng.random(len(picked)) < 0.5)[mine]
                    images[flip] = images[flip, ..., ::-1]
            yield self._model_input(images, index, len(picked), mine), self.labels[picked[mine]]

    def _model_input(self, images, index: int, global_count: int, mine: slice) -> np.ndarray:
        if self.preprocess is None:
            return images.astype(np.float32) / 255.0
        rng = np.random.default_rng([self.seed, self.epoch, index, 2])  # its own stream: shifts stay as they were
        return self.preprocess(images, rng, part=(global_count, mine))

    def shard_slice(self, global_count: int) -> slice:
        """This rank's part of a global batch of ``global_count`` examples (all of it without a shard)."""
        return slice(self.rank * global_count // self.world_size, (self.rank + 1) * global_count // self.world_size)

    def __iter__(self):
        return self.batches()


def _check_shard(shard, batch_size):
    try:
        rank, world_size = (int(v) for v in shard)
    except (TypeError, ValueError):
        raise ValueError(f"BatchIterator: shard must be (rank, world_size), got {shard!r}") from None
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"BatchIterator: shard rank {rank} is not in 0..{world_size - 1}")
    if batch_size % world_size:
        raise ValueError(f"BatchIterator: the global batch size {batch_size} does not divide by the world size {world_size}")
    return rank, world_size
