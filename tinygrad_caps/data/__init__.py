"""Datasets: file formats (IDX, smallNORB, CIFAR-10 binary, image folders), one registry, seeded batches.

    from tinygrad_caps.data import dataset_spec, BatchIterator
    spec = dataset_spec("smallnorb")
    images, labels = spec.load("train")
    batches = BatchIterator(images, labels, 100, shuffle=True, augment=spec.augment,
                            preprocess=spec.train_preprocess)
"""
from .batches import AUGMENTATIONS, BatchIterator, shift_images
from .cache import cache_root, downloads_allowed
from .cifar import load_cifar10, parse_cifar_records
from .errors import DatasetError, DatasetOptionError
from .folder import folder_classes, load_image_folder
from .idx import IDXError, parse_idx, read_idx, write_idx
from .mnist import (ALL_FILES, KNOWN, SPLIT_FILES, candidate_dirs, download, find_dataset_dir, load_fashion_mnist,
                    load_mnist)
from .norb import NORBError, load_smallnorb, read_norb_matrix, write_norb_matrix
from .preprocess import Preprocess
from .registry import DATASETS, REGISTRY, DatasetSpec, dataset_spec, load_dataset
from .transforms import affine_bilinear, center_crop, random_crop, resize_bilinear, standardize

__all__ = [
    "ALL_FILES", "AUGMENTATIONS", "BatchIterator", "DATASETS", "DatasetError", "DatasetOptionError", "DatasetSpec",
    "IDXError", "KNOWN",
    "NORBError", "Preprocess", "REGISTRY", "SPLIT_FILES", "affine_bilinear", "cache_root", "candidate_dirs",
    "center_crop", "dataset_spec", "download", "downloads_allowed", "find_dataset_dir", "folder_classes",
    "load_cifar10", "load_dataset", "load_fashion_mnist", "load_image_folder", "load_mnist", "load_smallnorb",
    "parse_cifar_records", "parse_idx", "random_crop", "read_idx", "read_norb_matrix", "resize_bilinear",
    "shift_images", "standardize", "write_idx", "write_norb_matrix",
]
