"""What a dataset's stored uint8 images go through before the model sees them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .transforms import (brightness_contrast, center_crop, crop_at, jitter_parameters, random_crop_offsets,
                         standardize)


@dataclass(frozen=True)
class Preprocess:
    """uint8 images (N, C, H, W) -> float32 (N, C, S, S).

    Attributes:
        standardize: each image to zero mean and unit variance (else pixels / 255, in [0, 1]).
        crop: the output size S (None: keep H, W); taken at random when ``random_crop``, else centred.
        jitter: (max brightness offset, (lowest, highest) contrast factor) drawn per image, applied
            after the scaling, or None.
    """

    standardize: bool = False
    crop: int | None = None
    random_crop: bool = False
    jitter: tuple | None = None

    def output_size(self, stored_size: int) -> int:
        """The side S of the preprocessed images, given stored images of side ``stored_size``."""
        return stored_size if self.crop is None else self.crop

    @property
    def is_random(self) -> bool:
        return self.random_crop or self.jitter is not None

    def __call__(self, images, rng: np.random.Generator | None = None, part=None) -> np.ndarray:
        """Preprocess ``images`` (N, C, H, W) uint8 -> float32 (N, C, S, S).

        ``rng`` draws the random crops and jitter. ``part=(count, selection)`` draws them for
        ``count`` images and uses ``selection`` of them, so that one shard of a batch gets exactly
        what the whole batch would (``BatchIterator(shard=...)``).
        """
        if self.is_random and rng is None:
            raise ValueError("Preprocess: random crops or jitter need a generator (rng)")
        images = np.asarray(images)
        count, selection = part if part is not None else (len(images), slice(None))
        x = standardize(images) if self.standardize else images.astype(np.float32) / 255.0
        if self.crop is not None and self.random_crop:
            tops, lefts = random_crop_offsets(count, x.shape[2], x.shape[3], self.crop, rng)
            x = crop_at(x, self.crop, tops[selection], lefts[selection])
        elif self.crop is not None:
            x = center_crop(x, self.crop)
        if self.jitter is not None:
            offsets, factors = jitter_parameters(count, rng, self.jitter[0], self.jitter[1])
            x = brightness_contrast(x, offsets[selection], factors[selection])
        return np.ascontiguousarray(x, dtype=np.float32)


UNIT_SCALE = Preprocess()
