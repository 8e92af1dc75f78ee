"""CapsNet's losses: the class losses on the class scores (the margin loss on capsule lengths, the
spread loss, the negative log-likelihood), the reconstruction loss, and the training loss a recipe
makes of them (``training_loss``). Every one is built from engine ops, so the engine derives its
gradients (and their gradients)."""
from __future__ import annotations

import math
from dataclasses import dataclass

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


# The spread loss's margin schedules (``SPREAD_MARGIN_SCHEDULES``), each a function of where the run is:
#   "paper"       Hinton et al. 2018, section 3.1: "we start with a small margin of 0.2 and linearly
#                 increase it during training to 0.9": m = 0.2 + 0.7 progress, progress the share of
#                 the run's training steps done (0 at the first step, 1 at the end).
#   "ibm"         the authors' own formula, given on OpenReview and run by IBM's code
#                 (IBM/matrix-capsules-with-em-routing models.py:287-294): m = 0.2 + 0.79
#                 sigmoid(min(10, step / 50000 - 4)), step the global training step; about 0.214
#                 for the first thousand steps.
#   "sr-capsnet"  SR-CapsNet's (coder3000/SR-CapsNet loss.py:25-36, ``EmRoutingLoss``): m = 0.2 +
#                 (0.2 / epochs) min(epoch, epochs), epoch the 0-based index of the current epoch:
#                 0.2 to 0.36 over 5 epochs.
SPREAD_MARGIN_START = 0.2
SPREAD_MARGIN_END = 0.9
SPREAD_MARGIN_SCHEDULES = ("paper", "ibm", "sr-capsnet")
IBM_MARGIN_DELTA = 0.79
IBM_MARGIN_STEPS = 50000.0
SR_CAPSNET_MARGIN_RISE = 0.2
NLL_EPS = 1e-12  # under the log of nll_loss: a score that underflowed to 0 costs -log(1e-12), not inf


def spread_margin(progress: float) -> float:
    """The spread loss's margin at ``progress`` (the share of the run's training steps done, clipped
    to [0, 1]) under the paper's schedule: 0.2 + 0.7 * progress, from 0.2 at the start to 0.9 at the end."""
    progress = min(1.0, max(0.0, float(progress)))
    return SPREAD_MARGIN_START + (SPREAD_MARGIN_END - SPREAD_MARGIN_START) * progress


def ibm_spread_margin(step: int) -> float:
    """The margin of the authors' formula as IBM's code runs it at global training step ``step``:
    0.2 + 0.79 sigmoid(min(10, step / 50000 - 4))."""
    z = min(10.0, float(step) / IBM_MARGIN_STEPS - 4.0)
    return SPREAD_MARGIN_START + IBM_MARGIN_DELTA / (1.0 + math.exp(-z))


def sr_capsnet_spread_margin(epoch: int, epochs: int) -> float:
    """SR-CapsNet's margin in epoch ``epoch`` (0-based) of ``epochs``: 0.2 + (0.2 / epochs) min(epoch, epochs)."""
    if epochs < 1:
        raise ValueError(f"sr_capsnet_spread_margin: epochs must be >= 1, got {epochs}")
    return SPREAD_MARGIN_START + SR_CAPSNET_MARGIN_RISE / epochs * min(max(int(epoch), 0), epochs)


@dataclass(frozen=True)
class TrainingPosition:
    """Where a run is, for a loss whose margin follows it: ``step`` global training steps done
    (the current step's index), ``steps_per_epoch`` batches an epoch, ``epochs`` epochs in the run."""

    step: int
    steps_per_epoch: int
    epochs: int

    def __post_init__(self):
        if self.step < 0 or self.steps_per_epoch < 1 or self.epochs < 1:
            raise ValueError(f"TrainingPosition: step >= 0, steps_per_epoch >= 1 and epochs >= 1, got {self}")

    @property
    def progress(self) -> float:
        """The share of the run's steps done: step / (epochs * steps_per_epoch)."""
        return self.step / (self.epochs * self.steps_per_epoch)

    @property
    def epoch(self) -> int:
        """The 0-based index of the current epoch."""
        return self.step // self.steps_per_epoch


def scheduled_spread_margin(schedule: str, position: "TrainingPosition | None") -> float:
    """The spread loss's margin under ``schedule`` (``SPREAD_MARGIN_SCHEDULES``) at ``position``; a
    model outside a run (``position`` None) takes the final margin 0.9 under every schedule (the
    paper's, and SR-CapsNet's own when no epoch is given)."""
    if schedule not in SPREAD_MARGIN_SCHEDULES:
        raise ValueError(f"spread margin schedule must be one of {', '.join(SPREAD_MARGIN_SCHEDULES)}, "
                         f"got {schedule!r}")
    if position is None:
        return SPREAD_MARGIN_END
    if schedule == "paper":
        return spread_margin(position.progress)
    if schedule == "ibm":
        return ibm_spread_margin(position.step)
    return sr_capsnet_spread_margin(position.epoch, position.epochs)


def _class_targets(name: str, scores, labels):
    if scores.ndim != 2:
        raise ValueError(f"{name}: expected class scores (B, K), got shape {scores.shape}")
    y = _label_array(labels, scores.data)
    if y.shape != scores.shape[:1]:
        raise ValueError(f"{name}: labels of shape {tuple(y.shape)} do not fit scores {scores.shape}")
    return F.one_hot(y, scores.shape[1], dtype=scores.dtype)


def spread_loss(scores, labels, margin: float = SPREAD_MARGIN_END) -> Tensor:
    """Per-example spread loss (Hinton, Sabour & Frosst 2018, eq. 3): sum over the classes i other
    than the target t of max(0, margin - (a_t - a_i))^2.

    Args:
        scores: (B, K) class scores a (EM routing's output activations, or capsule lengths).
        labels: (B,) integer classes. margin: m (``spread_margin`` gives the schedule's).
    Returns:
        (B,) loss per example (its batch mean is the batch loss, as IBM's code takes it).
    """
    target = _class_targets("spread_loss", scores, labels)
    a_target = F.sum(scores * target, axis=1, keepdims=True)
    gap = F.relu(margin - (a_target - scores))
    return F.sum((1 - target) * gap * gap, axis=1)


def nll_loss(scores, labels, eps: float = NLL_EPS) -> Tensor:
    """Per-example negative log-likelihood of the target's score: -log(a_t + eps), as SR-CapsNet
    trains self-routing (``NLLLoss`` on ``log a_out``; their scores sum to 1 over the classes).

    Args:
        scores: (B, K) class scores in (0, 1]. labels: (B,) integer classes. eps: under the log.
    Returns:
        (B,) loss per example.
    """
    target = _class_targets("nll_loss", scores, labels)
    return -F.sum(target * F.log(scores + eps), axis=1)


CLASS_LOSSES = ("margin", "spread", "nll")


def class_loss(scores, labels, kind: str = "margin", convention: str = "paper",
               margin: float = SPREAD_MARGIN_END) -> Tensor:
    """Per-example class loss ``kind`` on the class scores (B, K): "margin" (``margin_loss`` in
    ``convention``), "spread" (``spread_loss`` with ``margin``) or "nll" (``nll_loss``); returns (B,)."""
    if kind == "margin":
        return margin_loss(scores, labels, convention=convention)
    if kind == "spread":
        return spread_loss(scores, labels, margin)
    if kind == "nll":
        return nll_loss(scores, labels)
    raise ValueError(f"class_loss: kind must be one of {', '.join(CLASS_LOSSES)}, got {kind!r}")


def training_loss(scores, reconstruction, images, labels, kind: str = "margin",
                  reconstruction_weight: float = DEFAULT_RECONSTRUCTION_WEIGHT, convention: str = "paper",
                  margin: float = SPREAD_MARGIN_END, return_terms: bool = False):
    """Batch mean of class_loss (``kind``) + reconstruction_weight * reconstruction_loss: a recipe's
    training loss, a scalar Tensor. ``kind="margin"`` is ``capsule_loss`` itself (the same ops).

    Args:
        scores: (B, K) class scores. reconstruction: (B, P). images: (B, ...) with P pixels.
        labels: (B,) integers. kind, convention, margin: as ``class_loss`` takes them.
    Returns:
        The loss; with ``return_terms``, ``(loss, class term (B,), reconstruction term (B,))``.
    """
    if kind == "margin":
        return capsule_loss(scores, reconstruction, images, labels, reconstruction_weight, convention=convention,
                            return_terms=return_terms)
    per_example = class_loss(scores, labels, kind, convention, margin)
    recon = reconstruction_loss(reconstruction, images)
    loss = F.mean(per_example + reconstruction_weight * recon)
    return (loss, per_example, recon) if return_terms else loss
