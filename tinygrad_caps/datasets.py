"""Compatibility module: the data code lives in ``tinygrad_caps.data``; these names still import from here."""
import urllib  # noqa: F401  (``datasets.urllib.request`` stays reachable, as before the move)
import urllib.request  # noqa: F401

from .data import (ALL_FILES, AUGMENTATIONS, KNOWN, SPLIT_FILES, BatchIterator, DatasetError, IDXError,  # noqa: F401
                   cache_root, candidate_dirs, download, downloads_allowed, find_dataset_dir, load_dataset,
                   load_fashion_mnist, load_mnist, parse_idx, read_idx, shift_images, write_idx)
from .data.idx import _IDX_TYPES, _decompressed_bytes  # noqa: F401
from .data.mnist import _find_file, _missing_message  # noqa: F401

__all__ = [
    "ALL_FILES", "AUGMENTATIONS", "BatchIterator", "DatasetError", "IDXError", "KNOWN", "SPLIT_FILES",
    "cache_root", "candidate_dirs", "download", "downloads_allowed", "find_dataset_dir", "load_dataset",
    "load_fashion_mnist", "load_mnist", "parse_idx", "read_idx", "shift_images", "write_idx",
]
