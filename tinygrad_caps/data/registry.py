"""One registry of datasets: name -> loader, class names, image geometry and preprocessing.

``dataset_spec(name, ...)`` describes a dataset; ``train``, ``evaluate``, ``gradflow`` and
``visualize`` take the model's ``in_channels``, ``image_size`` and ``num_classes`` from it, the
training batches its ``train_preprocess`` and default ``augment``, and every evaluation its
``test_preprocess``. Any other name is a folder of the four IDX files under ``data_dir``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import cifar, norb
from .errors import DatasetError, DatasetOptionError
from .folder import check_image_folder_split, folder_classes, image_folder_count, load_image_folder
from .labels import class_count, require_examples
from .mnist import KNOWN, check_idx_available, idx_image_count, idx_image_shape, load_idx_dataset, load_idx_labels
from .preprocess import UNIT_SCALE, Preprocess

# Hinton, Sabour and Frosst (2018), "Matrix capsules with EM routing", section 5 (smallNORB): "We
# downsample smallNORB to 48x48 pixels and normalize each image to have zero mean and unit variance.
# During training, we randomly crop 32x32 patches and add random brightness and contrast to the
# cropped images. During test, we crop a 32x32 patch from the center of the image". The paper gives
# no jitter magnitudes; these are TensorFlow's random_brightness(max_delta=32/255) and
# random_contrast(0.5, 1.5) that its public reimplementations use, applied to the standardized image.
NORB_TRAIN = Preprocess(standardize=True, crop=32, random_crop=True, jitter=(32 / 255, (0.5, 1.5)))
NORB_TEST = Preprocess(standardize=True, crop=32)
# Sabour, Frosst and Hinton (2017), section 7: CIFAR-10 trained on 24x24 patches of the images;
# random patches in training, the centre one at test.
CIFAR_TRAIN = Preprocess(crop=24, random_crop=True)
CIFAR_TEST = Preprocess(crop=24)


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset as the models see it.

    Attributes:
        name: the registry name (the CLI's ``--dataset``).
        classes: the class names, index = label.
        channels, image_size: the geometry of the images after preprocessing (the model's input).
        train_preprocess, test_preprocess: stored uint8 (N, C, H, W) -> float32 (N, channels,
            image_size, image_size), with random crops/jitter in training only.
        augment: the default training augmentation of ``BatchIterator`` (None, "shift", "shift+flip").
        loader: (split, data_dir, download_missing) -> (uint8 images, int64 labels) as stored.
        available: (split, data_dir, download_missing) -> None; the DatasetError ``loader`` would
            raise where the split's files are not where it looks (``check_available``).
        counter: (split, data_dir) -> the number of images of the split, read from the files'
            headers or listing without their images (``image_count``); None where unknown.
    """

    name: str
    classes: tuple
    channels: int
    image_size: int
    train_preprocess: Preprocess
    test_preprocess: Preprocess
    augment: str | None
    loader: Callable
    available: Callable | None = None
    counter: Callable | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def load(self, split: str, data_dir=None, download_missing: bool | None = None):
        """The stored images and labels of ``split``: uint8 (N, C, H, W), int64 (N,); checked against
        the spec (channels, the size the preprocessing turns them into, labels below num_classes, at
        least one example)."""
        images, labels = self.loader(split, data_dir, download_missing)
        require_examples(len(labels), self.name, split, data_dir if data_dir is not None else "the data cache")
        if images.ndim != 4 or images.shape[1] != self.channels:
            raise DatasetError(f"dataset {self.name!r} ({split}): expected images (N, {self.channels}, H, W), "
                               f"got {images.shape}")
        size = self.test_preprocess.output_size(images.shape[2])
        if images.shape[2] != images.shape[3] or size != self.image_size:
            raise DatasetError(f"dataset {self.name!r} ({split}): {images.shape[2]}x{images.shape[3]} images do not "
                               f"give the registered {self.image_size}x{self.image_size} model input")
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise DatasetError(f"dataset {self.name!r} ({split}): label {int(labels.max())} is out of range "
                               f"0..{self.num_classes - 1}")
        return images, labels

    def image_count(self, split: str, data_dir=None) -> int | None:
        """The images of ``split`` as loading would give them, without reading them (after
        ``check_available``), or None where the dataset cannot tell."""
        return None if self.counter is None else self.counter(split, data_dir)

    def check_available(self, data_dir=None, download_missing: bool | None = None) -> None:
        """The DatasetError ``load`` would raise where a split's files are not where it looks for
        them and may not be downloaded; nothing is read or downloaded (a run's checks before its data)."""
        if self.available is not None:
            for split in ("train", "test"):
                self.available(split, data_dir, download_missing)

    def preprocess(self, images, train: bool = False, rng: np.random.Generator | None = None) -> np.ndarray:
        """Stored uint8 (N, C, H, W) -> the model's float32 input (N, channels, image_size, image_size)."""
        return (self.train_preprocess if train else self.test_preprocess)(images, rng)

    def check_model(self, in_channels: int, image_size: int, num_classes: int, where: str = "the model") -> None:
        """Raise DatasetOptionError (a ValueError) unless a model with this geometry takes this dataset's images."""
        if (in_channels, image_size, num_classes) != (self.channels, self.image_size, self.num_classes):
            raise DatasetOptionError(f"{where} takes {in_channels}x{image_size}x{image_size} images in {num_classes} "
                                     f"classes, but dataset {self.name!r} gives {self.channels}x{self.image_size}x"
                                     f"{self.image_size} in {self.num_classes}")


def _fixed_geometry(name, channels, size, image_size, requested_channels):
    if image_size is not None and image_size != size:
        raise DatasetOptionError(f"dataset {name!r} gives {size}x{size} model inputs; --image-size resizes only "
                                 f"'imagefolder' datasets (got {image_size})")
    if requested_channels is not None and requested_channels != channels:
        raise DatasetOptionError(f"dataset {name!r} has {channels} channel(s); --channels applies only to "
                                 f"'imagefolder' datasets (got {requested_channels})")


def _idx_spec(name, data_dir, image_size, channels):
    info = KNOWN.get(name)
    if info is not None:
        _fixed_geometry(name, 1, 28, image_size, channels)
        return DatasetSpec(name, tuple(info["classes"]), 1, 28, UNIT_SCALE, UNIT_SCALE, "shift",
                           lambda split, d, dl: load_idx_dataset(name, split, d, dl),
                           lambda split, d, dl: check_idx_available(name, d, dl),
                           lambda split, d: idx_image_count(name, split, d))
    # Any other name: a folder of the four IDX files, its geometry read from the files themselves
    # (the images' header; their data is read once, by the spec's load)
    _, found_channels, height, width = idx_image_shape(name, "train", data_dir)
    train_labels, test_labels = (load_idx_labels(name, split, data_dir) for split in ("train", "test"))
    if height != width:
        raise DatasetError(f"dataset {name!r}: CapsNet needs square images, got {height}x{width}")
    _fixed_geometry(name, found_channels, height, image_size, channels)
    num_classes = class_count(name, train_labels, test_labels)  # 0..K-1, every class present in training
    return DatasetSpec(name, tuple(str(k) for k in range(num_classes)), found_channels, height, UNIT_SCALE,
                       UNIT_SCALE, "shift", lambda split, d, dl: load_idx_dataset(name, split, d, dl),
                       lambda split, d, dl: check_idx_available(name, d, dl),
                       lambda split, d: idx_image_count(name, split, d if d is not None else data_dir))


def _smallnorb_spec(name, data_dir, image_size, channels):
    _fixed_geometry(name, 2, 32, image_size, channels)
    return DatasetSpec(name, norb.CLASSES, 2, 32, NORB_TRAIN, NORB_TEST, None,
                       lambda split, d, dl: norb.load_smallnorb(split, d, dl),
                       lambda split, d, dl: norb.check_smallnorb_available(split, d, dl))


def _cifar10_spec(name, data_dir, image_size, channels):
    _fixed_geometry(name, 3, 24, image_size, channels)
    return DatasetSpec(name, cifar.CLASSES, 3, 24, CIFAR_TRAIN, CIFAR_TEST, None,
                       lambda split, d, dl: cifar.load_cifar10(split, d, dl),
                       lambda split, d, dl: cifar.check_cifar10_available(split, d, dl))


def _imagefolder_spec(name, data_dir, image_size, channels):
    image_size = 32 if image_size is None else image_size
    channels = 3 if channels is None else channels
    if channels not in (1, 3):
        raise DatasetOptionError(f"--channels must be 1 or 3, got {channels}")
    if image_size < 1:
        raise DatasetOptionError(f"--image-size must be positive, got {image_size}")
    root = data_dir
    classes = tuple(folder_classes(root))
    return DatasetSpec(name, classes, channels, image_size, UNIT_SCALE, UNIT_SCALE, "shift",
                       lambda split, d, dl: load_image_folder(root if d is None else d, split, image_size, channels),
                       lambda split, d, dl: check_image_folder_split(root if d is None else d, split, image_size, channels),
                       lambda split, d: image_folder_count(root if d is None else d, split))


# The datasets whose geometry --image-size and --channels choose; every other one has its own.
OPTION_GEOMETRY = ("imagefolder",)
REGISTRY = {"mnist": _idx_spec, "fashion-mnist": _idx_spec, "smallnorb": _smallnorb_spec, "cifar10": _cifar10_spec,
            "imagefolder": _imagefolder_spec}
DATASETS = tuple(REGISTRY)


def unknown_dataset_reason(name: str) -> str:
    """Why ``name`` is no registered dataset, with the nearest registered name where one is close
    (``"fashion_mnist"`` -> ``... did you mean 'fashion-mnist'? ...``) and the whole list."""
    import difflib

    near = difflib.get_close_matches(name.lower(), DATASETS, n=1, cutoff=0.6)
    guess = f"did you mean {near[0]!r}? " if near else ""
    return f"not a known dataset: {guess}the known ones are {', '.join(DATASETS)}"


def dataset_spec(name: str, data_dir=None, image_size: int | None = None, channels: int | None = None) -> DatasetSpec:
    """The registry's description of ``name`` (any other name: an IDX folder under ``data_dir``).

    ``image_size`` and ``channels`` choose the geometry of an ``imagefolder`` (default 32 and 3);
    for other datasets they may only repeat the registered values (a checkpoint's config does).
    """
    _require_folder(data_dir)
    return REGISTRY.get(name, _idx_spec)(name, data_dir, image_size, channels)


def _require_folder(data_dir) -> None:
    """DatasetError when ``data_dir`` exists but is not a folder (no dataset can be put into it)."""
    if data_dir is not None and Path(data_dir).exists() and not Path(data_dir).is_dir():
        raise DatasetError(f"--data-dir {data_dir} is a file, not a folder")


def load_dataset(name: str, split: str = "train", data_dir=None, download_missing: bool | None = None, *,
                 image_size: int | None = None, channels: int | None = None):
    """Images and labels of one split of a dataset, as stored (before preprocessing).

    Args:
        name: a registered dataset (``DATASETS``), or any name whose four IDX files are in ``data_dir``.
        split: "train" or "test".
        download_missing: fetch a known dataset that no folder holds (default: unless
            ``$TINYGRAD_CAPS_OFFLINE=1``).
        image_size, channels: an ``imagefolder``'s geometry (see ``dataset_spec``).
    Returns:
        (images, labels): uint8 (N, C, H, W) and int64 (N,); ``dataset_spec(name).preprocess``
        turns the images into the model's input.
    """
    if split not in ("train", "test"):
        raise ValueError(f"load_dataset: split must be 'train' or 'test', got {split!r}")
    _require_folder(data_dir)
    if name in REGISTRY:
        return dataset_spec(name, data_dir, image_size, channels).load(split, data_dir, download_missing)
    return load_idx_dataset(name, split, data_dir, download_missing)


__all__ = ["DATASETS", "DatasetSpec", "KNOWN", "OPTION_GEOMETRY", "REGISTRY", "dataset_spec", "load_dataset"]
