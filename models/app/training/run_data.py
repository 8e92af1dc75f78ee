"""A run's data: the dataset's spec, its training and test images (the first ``--limit-train`` and
``--limit-test``) and the loader of the training batches, each drawn per (seed, epoch, batch)."""
from __future__ import annotations

from tinygrad_caps.data import BatchIterator, find_dataset_dir


def limited(images, labels, limit):
    """The first ``limit`` images and labels (all of them when ``limit`` is 0 or None)."""
    return (images, labels) if not limit else (images[:limit], labels[:limit])


class RunData:
    """The run's dataset ``spec``, ``train_images``/``train_labels``, ``test_images``/``test_labels``
    and the ``loader`` of the training batches (this process's part of each with ``shard``), as the
    RunSetup ``setup`` (``preflight``'s) describes them."""

    def __init__(self, setup, shard=(0, 1)):
        config, self.spec = setup.config, setup.spec
        self.dataset, self.data_dir = config.dataset, config.data_dir
        self.train_images, self.train_labels = limited(*self.spec.load("train", config.data_dir), config.limit_train)
        self.test_images, self.test_labels = limited(*self.spec.load("test", config.data_dir), config.limit_test)
        self.loader = BatchIterator(self.train_images, self.train_labels, config.batch_size, shuffle=True,
                                    augment=None if config.augment == "none" else config.augment, seed=config.seed,
                                    preprocess=self.spec.train_preprocess, shard=shard)

    def summary(self) -> str:
        """The run's "data: ..." line: the dataset, where it was found, the image and class counts."""
        folder = find_dataset_dir(self.dataset, self.data_dir)
        return (f"data: {self.dataset}{f' from {folder}' if folder else ''}, {len(self.train_labels)} training and "
                f"{len(self.test_labels)} test images, {self.spec.num_classes} classes")
