"""What the capsule studies (benchmarks/studies/) share: their command-line options, their data, a
small training loop on ``capsule_loss`` and the test accuracy. The figures they record are in
``analysis.study_figures``."""
from __future__ import annotations

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.data import BatchIterator, load_dataset

from ..capsnet.losses import DEFAULT_RECONSTRUCTION_WEIGHT, capsule_loss


def add_study_options(p) -> None:
    """The options the studies share: data, the reduced model's sizes, the training budget's knobs."""
    p.add_argument("--test-images", type=int, default=1000)
    p.add_argument("--stats-images", type=int, default=32, help="batch on which the gradient figures are measured")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--conv1-channels", type=int, default=64)
    p.add_argument("--primary-types", type=int, default=16)
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seed", type=int, default=0)


def study_data(args, train_images: int) -> tuple:
    """((train images, labels), (test images, labels), (stats batch Tensor, labels)): the first
    ``train_images`` training images, the first ``--test-images`` test images, and the last
    ``--stats-images`` training images (pixels / 255) on which the figures are measured."""
    images, labels = load_dataset(args.dataset, "train", args.data_dir)
    test_images, test_labels = load_dataset(args.dataset, "test", args.data_dir)
    stats = (tc.tensor(images[-args.stats_images:].astype(np.float32) / 255.0), labels[-args.stats_images:])
    return ((images[:train_images], labels[:train_images]), (test_images[:args.test_images],
                                                             test_labels[:args.test_images]), stats)


def train_images(model, images, labels, batch_size, lr, seed, reconstruction_weight=DEFAULT_RECONSTRUCTION_WEIGHT):
    """One pass of Adam on ``capsule_loss`` (in the model's conventions) over (images, labels) in
    shuffled batches; returns the mean training loss."""
    optimizer = tc.optim.Adam(model.parameters(), lr=lr)
    total, seen = 0.0, 0
    model.train()
    for x, y in BatchIterator(images, labels, batch_size, shuffle=True, seed=seed).batches():
        x = tc.tensor(x)
        outputs = model(x, y)
        loss = capsule_loss(outputs.lengths, outputs.reconstruction, x, y, reconstruction_weight,
                            convention=model.config.conventions)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(y)
        seen += len(y)
    return total / max(seen, 1)


def test_accuracy(model, images, labels, batch_size=100) -> float:
    """Share of test images whose longest capsule is the label."""
    model.eval()
    correct = 0
    with tc.no_grad():
        for x, y in BatchIterator(images, labels, batch_size).batches():
            correct += int((model(tc.tensor(x)).lengths.numpy().argmax(axis=1) == y).sum())
    return correct / max(len(labels), 1)
