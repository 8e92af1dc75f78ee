"""CapsNet's losses: the margin loss on capsule lengths and the reconstruction loss."""
from __future__ import annotations

import numpy as np

from tinygrad_caps import functional as F
from tinygrad_caps.backend import asarray_like
from tinygrad_caps.tensor import Tensor


def _label_array(labels, like):
    """Integer labels (a list, NumPy or CuPy array, or Tensor) as an array on the device of ``like``."""
    data = labels.data if isinstance(labels, Tensor) else labels
    if not hasattr(data, "dtype"):
        data = np.asarray(data)
    if data.dtype.kind not in "iu":
        raise ValueError(f"labels must be integers, got {data.dtype}")
    return asarray_like(data, like)


MARGIN_CONVENTIONS = ("paper", "official")
# The paper's weight of the reconstruction term (the official code's ``balance_factor``); the
# default of capsule_loss, of the trainer and of ``train --reconstruction-weight``.
DEFAULT_RECONSTRUCTION_WEIGHT = 0.0005


def margin_loss(lengths, labels, m_plus: float = 0.9, m_minus: float = 0.1, down_weight: float = 0.5,
                convention: str = "paper") -> Tensor:
    """Per-example margin loss on capsule lengths.

    ``"paper"`` (Sabour et al. eq. 4): sum_k T_k max(0, m+ - |v_k|)^2 + down_weight (1 - T_k) max(0, |v_k| - m-)^2.
    ``"official"`` (Sarasra/models research/capsules, models/layers/layers.py ``_margin_loss`` and
    ``evaluate``): each class costs 0.5 T_k max(0, m+ - |v_k|)^2 + 0.5 down_weight (1 - T_k)
    max(0, |v_k| - m-)^2 and the batch loss is the mean over the batch and the K classes, so the
    per-example value here is the mean over classes: the paper's sum times 1/(2K).

    Args:
        lengths: (B, K) capsule lengths. labels: (B,) integer classes (NumPy array or Tensor).
    Returns:
        (B,) loss per example (its batch mean is the batch loss under either convention).
    """
    if convention not in MARGIN_CONVENTIONS:
        raise ValueError(f"margin_loss: convention must be one of {MARGIN_CONVENTIONS}, got {convention!r}")
    if lengths.ndim != 2:
        raise ValueError(f"margin_loss: expected lengths (B, K), got shape {lengths.shape}")
    y = _label_array(labels, lengths.data)
    if y.shape != lengths.shape[:1]:
        raise ValueError(f"margin_loss: labels of shape {tuple(y.shape)} do not fit lengths {lengths.shape}")
    target = F.one_hot(y, lengths.shape[1], dtype=lengths.dtype)
    present = F.relu(m_plus - lengths) ** 2
    absent = F.relu(lengths - m_minus) ** 2
    per_class = target * present + down_weight * (1 - target) * absent
    if convention == "official":
        return F.mean(0.5 * per_class, axis=1)
    return F.sum(per_class, axis=1)


def _as_pixels(images, like: Tensor) -> Tensor:
    if not isinstance(images, Tensor):
        images = Tensor._wrap(asarray_like(images, like.data))
    return F.reshape(F.cast(images, like.dtype), (images.shape[0], -1))


def reconstruction_loss(reconstruction, images) -> Tensor:
    """Per-example sum of squared pixel errors: reconstruction (B, P), images (B, ...) with P pixels; returns (B,)."""
    pixels = _as_pixels(images, reconstruction)
    if pixels.shape != reconstruction.shape:
        raise ValueError(f"reconstruction_loss: reconstruction {reconstruction.shape} and images {pixels.shape} differ")
    diff = reconstruction - pixels
    return F.sum(diff * diff, axis=1)


def capsule_loss(lengths, reconstruction, images, labels,
                 reconstruction_weight: float = DEFAULT_RECONSTRUCTION_WEIGHT, m_plus: float = 0.9,
                 m_minus: float = 0.1, down_weight: float = 0.5, convention: str = "paper",
                 return_terms: bool = False):
    """Batch mean of margin_loss (of ``convention``) + reconstruction_weight * reconstruction_loss; a scalar Tensor.

    The reconstruction term is the same in both conventions (the official code's weighted
    ``reduce_mean(reduce_sum(squared error))``, layers.py ``reconstruction``).
    With ``return_terms``, ``(loss, margin, reconstruction)``: the loss and the per-example margin
    and (unweighted) reconstruction losses (B,) it was made of, for metrics or for the gradient of
    each term.
    """
    margin = margin_loss(lengths, labels, m_plus, m_minus, down_weight, convention)
    recon = reconstruction_loss(reconstruction, images)
    loss = F.mean(margin + reconstruction_weight * recon)
    return (loss, margin, recon) if return_terms else loss
