"""A model's losses on a batch and its evaluation on a dataset: what a training step computes
(``device_losses``, captured in a CUDA graph as it is) and what a run's test pass and ``evaluate``
report (``evaluate``: accuracy, mean losses, the confusion matrix)."""
from __future__ import annotations

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.data import BatchIterator

from ...capsnet.baseline_cnn import BaselineCNN
from ...capsnet.losses import DEFAULT_RECONSTRUCTION_WEIGHT


def batch_losses(model, x, y, reconstruction_weight, train: bool, traces=None):
    """(mean loss, per-example margin and reconstruction losses, predicted classes) for one batch.

    With a list as ``traces``, a CapsNet's forward also records its routing traces, set to record
    the gradient norm of every path in the coming backward, and appends them to that list.

    The decoder is masked by the labels when ``train``, by the prediction otherwise; the loss is the
    model's (``CapsNet.loss``: its recipe's class loss, the margin loss in its ``conventions`` under
    the common recipe), and the "margin" entries hold that class loss. For a BaselineCNN they hold
    the per-example cross-entropy and the reconstruction entries are zero.
    """
    with tc.backend.on_device(model.device):  # labels and predictions beside the model, whichever GPU is current
        return _batch_losses(model, x, y, reconstruction_weight, train, traces)


def _batch_losses(model, x, y, reconstruction_weight, train, traces):
    images = tc.tensor(x, device=model.device)  # one upload per batch, used by the model and the loss
    labels = tc.backend.asarray_like(y, images.data)  # the same for the labels (the mask and the margin loss)
    loss, margin, recon, predicted = device_losses(model, images, labels, reconstruction_weight, train, traces)
    return loss, margin, recon, tc.backend.to_numpy(predicted)


def device_losses(model, images, labels, reconstruction_weight, train: bool, traces=None):
    """``batch_losses`` on a batch already on the model's device (``images`` a Tensor, ``labels`` an
    array beside it), with the predicted classes left there too: nothing is read by the host, so a
    CUDA graph can capture it."""
    if isinstance(model, BaselineCNN):
        logits = model(images)
        cross_entropy = tc.functional.cross_entropy(logits, labels, reduction="none")
        return tc.functional.mean(cross_entropy), cross_entropy, cross_entropy * 0.0, logits.data.argmax(axis=1)
    outputs = model(images, labels if train else None, return_trace=traces is not None)
    if traces is not None:
        traces.extend(trace.track_grad_norms() for trace in outputs.traces)
    loss, margin, recon = model.loss(outputs, images, labels, reconstruction_weight, return_terms=True)
    return loss, margin, recon, outputs.lengths.data.argmax(axis=1)


def evaluate(model, images, labels, batch_size, num_classes, reconstruction_weight=DEFAULT_RECONSTRUCTION_WEIGHT,
             progress=None, preprocess=None, shard=(0, 1), check_stop=None):
    """Accuracy, mean losses and the confusion matrix (rows: true class) on a dataset, no augmentation.

    ``preprocess`` turns the stored uint8 images into the model's input (a dataset's
    ``test_preprocess``; default: pixels / 255). With ``shard=(rank, world_size)`` every rank
    evaluates its part of each batch and the totals are summed over the ranks (a collective).
    ``check_stop`` (a callable, or None) runs before each batch and may raise to stop the pass there
    (a training run's Ctrl-C during its test pass).
    """
    model.eval()
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    total_loss = total_margin = total_recon = 0.0
    with tc.no_grad():
        for x, y in BatchIterator(images, labels, batch_size, preprocess=preprocess, shard=shard):
            if check_stop is not None:
                check_stop()
            loss, margin, recon, predicted = batch_losses(model, x, y, reconstruction_weight, train=False)
            np.add.at(confusion, (y, predicted), 1)
            total_loss += loss.item() * len(y)
            total_margin += float(tc.backend.to_numpy(margin.data).sum())
            total_recon += float(tc.backend.to_numpy(recon.data).sum())
            if progress is not None:
                progress.update(len(y))
    if shard[1] > 1:
        totals = np.array([total_loss, total_margin, total_recon])
        tc.distributed.all_reduce(confusion)
        total_loss, total_margin, total_recon = tc.distributed.all_reduce(totals).tolist()
    n = max(1, int(confusion.sum()))
    return {"accuracy": float(np.trace(confusion) / n), "loss": total_loss / n, "margin_loss": total_margin / n,
            "reconstruction_loss": total_recon / n, "confusion": confusion}
