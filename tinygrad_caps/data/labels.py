"""Checks on a dataset's labels before a model is sized from them: integers 0..K-1, every class present."""
from __future__ import annotations

import numpy as np

from .errors import DatasetError

MIN_CLASSES = 2


def require_examples(count: int, dataset: str, split: str, where) -> None:
    """Raise DatasetError, naming the dataset, the split and its file or folder ``where``, when the
    split holds no examples (training would divide by zero; a test on nothing would report 0.0)."""
    if count == 0:
        raise DatasetError(f"{where}: the {split} split of dataset {dataset!r} holds no examples")


def class_count(name: str, train_labels: np.ndarray, test_labels: np.ndarray) -> int:
    """The number of classes K of a dataset, after checking its labels.

    The dataset must hold integer labels 0..K-1 with every class present in the training split, and
    test labels within that range. Raises DatasetError naming the first problem.
    """
    for split, labels in (("train", train_labels), ("test", test_labels)):
        if labels.dtype.kind not in "iu":
            raise DatasetError(f"{name}: {split} labels must be integers, got {labels.dtype}")
        if labels.size == 0:
            raise DatasetError(f"{name}: the {split} split holds no examples")
    low = int(min(train_labels.min(), test_labels.min()))
    if low < 0:
        raise DatasetError(f"{name}: labels must be >= 0, found {low}")
    classes = int(train_labels.max()) + 1
    if classes < MIN_CLASSES:
        raise DatasetError(f"{name}: the training labels hold a single class; a classifier needs at least {MIN_CLASSES}")
    if classes > len(train_labels):
        raise DatasetError(f"{name}: the largest training label is {classes - 1}, but there are only "
                           f"{len(train_labels)} training examples; labels must be 0..K-1 with every class present")
    present = np.bincount(train_labels.astype(np.int64), minlength=classes)
    absent = np.flatnonzero(present == 0)
    if absent.size:
        raise DatasetError(f"{name}: labels must be 0..K-1 with every class present in the training split; "
                           f"K = {classes} but class{'es' * (absent.size > 1)} "
                           f"{', '.join(map(str, absent[:10]))}{' ...' if absent.size > 10 else ''} never occur")
    high = int(test_labels.max())
    if high >= classes:
        raise DatasetError(f"{name}: a test label is {high}, but the training labels define {classes} classes (0..{classes - 1})")
    return classes
