"""IDX datasets: MNIST, Fashion-MNIST, or any folder holding the four IDX files.

Where the four files are looked for, in order:
    1. ``data_dir`` (the CLI's ``--data-dir``), and ``data_dir/<name>``;
    2. ``$TINYGRAD_CAPS_DATA/<name>``, else ``~/.cache/tinygrad-caps/<name>``;
    3. for Fashion-MNIST, the Debian package's folder ``/usr/share/datasets/fashion-mnist``
       (``apt-get install dataset-fashion-mnist``);
    4. a download from the standard public mirrors into folder 2, each file checked against the
       SHA-256 of its decompressed content and written atomically.
Offline with nothing found, the error names the four files and where to put them.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from .cache import cache_root, downloads_allowed, fetch_verified, search_dirs
from .cache import find_file as _find_file  # a module name of its own: tests replace it here
from .errors import DatasetError
from .idx import read_idx, read_idx_header
from .labels import require_examples

SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
ALL_FILES = SPLIT_FILES["train"] + SPLIT_FILES["test"]

KNOWN = {
    "mnist": {
        "mirrors": ["https://ossci-datasets.s3.amazonaws.com/mnist/",
                    "https://storage.googleapis.com/cvdf-datasets/mnist/"],
        # SHA-256 of the decompressed files
        "sha256": {
            "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        },
        "system_dirs": [],
        "classes": [str(i) for i in range(10)],
    },
    "fashion-mnist": {
        "mirrors": ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"],
        "sha256": {
            "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        },
        "system_dirs": ["/usr/share/datasets/fashion-mnist"],
        "classes": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                    "Ankle boot"],
    },
}


def candidate_dirs(name: str, data_dir=None) -> list[Path]:
    """The folders searched for ``name``'s IDX files, in order."""
    return search_dirs(name, data_dir, KNOWN.get(name, {}).get("system_dirs", []))


def find_dataset_dir(name: str, data_dir=None):
    """The first folder holding all four IDX files of ``name`` (raw or .gz), or None.

    A folder given as ``data_dir`` (or its ``<name>`` subfolder) that holds some of the files but
    not all is an error (DatasetError naming the missing ones), never a reason to fall through to
    another copy; a candidate folder that cannot be read is skipped.
    """
    for folder in candidate_dirs(name, data_dir):
        try:
            found = [_find_file(folder, stem) for stem in ALL_FILES]
        except PermissionError:
            continue
        if all(found):
            return folder
        if data_dir is not None and folder in (Path(data_dir), Path(data_dir) / name) and any(found):
            missing = ", ".join(stem for stem, path in zip(ALL_FILES, found) if path is None)
            raise DatasetError(f"{folder} holds only part of dataset {name!r}: {missing}[.gz] missing")
    return None


def download(name: str, target: Path) -> Path:
    """Fetch the four files of a known dataset into ``target`` (SHA-256 checked, atomic writes).

    ``target`` is created with the first file that arrives: a download that fails from the start
    leaves no empty folder behind."""
    info = KNOWN[name]
    for stem in ALL_FILES:
        if _find_file(target, stem):
            continue
        fetch_verified([mirror + stem + ".gz" for mirror in info["mirrors"]], target / f"{stem}.gz",
                       info["sha256"][stem], digest_of=gzip.decompress, timeout=30)
    return target


def _missing_message(name: str, data_dir, reason: str) -> str:
    files = ", ".join(f"{stem}[.gz]" for stem in ALL_FILES)
    where = Path(data_dir) if data_dir is not None else cache_root() / name
    hint = "\n  or install the Debian package: apt-get install dataset-fashion-mnist" if name == "fashion-mnist" else ""
    # each line reads on its own and after "; " (the CLI joins the lines into one)
    return (f"dataset {name!r} not found ({reason})\n  put the four files {files} into {where} "
            f"(or pass --data-dir){hint}")


def load_idx_dataset(name: str, split: str = "train", data_dir=None, download_missing: bool | None = None):
    """Images and labels of one split of an IDX dataset.

    Args:
        name: "mnist", "fashion-mnist", or any name whose four IDX files are in ``data_dir``.
        split: "train" or "test".
        download_missing: fetch a known dataset that no folder holds (default: unless
            ``$TINYGRAD_CAPS_OFFLINE=1``).
    Returns:
        (images, labels): uint8 (N, C, H, W) (C = 1 for 3-D IDX files) and int64 (N,).
    """
    images_path, labels_path = _split_files(name, split, data_dir, download_missing)
    folder = images_path.parent
    images, labels = read_idx(images_path), read_idx(labels_path)
    images = images.reshape(_nchw_shape(images.shape))
    if images.ndim != 4 or labels.ndim != 1 or len(images) != len(labels):
        raise DatasetError(f"{folder}: {split} images {images.shape} and labels {labels.shape} do not match")
    if images.dtype != np.uint8:
        raise DatasetError(f"{folder}: expected uint8 images, got {images.dtype}")
    require_examples(len(images), name, split, images_path)
    return images, _integer_labels(labels, folder, split)


def idx_image_shape(name: str, split: str = "train", data_dir=None) -> tuple:
    """(N, C, H, W) of one split's uint8 images, from the IDX header alone (C = 1 for 3-D files);
    nothing is downloaded. A dataset's geometry without reading its images."""
    images_path, _ = _split_files(name, split, data_dir, False)
    dtype, shape = read_idx_header(images_path)
    if len(_nchw_shape(shape)) != 4 or dtype != np.uint8:
        raise DatasetError(f"{images_path.parent}: expected uint8 images (N, C, H, W) or (N, H, W), got {shape} "
                           f"{dtype.newbyteorder('=').name}")
    return _nchw_shape(shape)


def idx_image_count(name: str, split: str = "train", data_dir=None) -> int | None:
    """The images of one split of an IDX dataset, from its header alone, or None where its files are
    not there yet (a known dataset that loading would download)."""
    if find_dataset_dir(name, data_dir) is None:
        return None
    return idx_image_shape(name, split, data_dir)[0]


def load_idx_labels(name: str, split: str = "train", data_dir=None):
    """One split's labels (N,) int64 of an IDX dataset, without its images; nothing is downloaded."""
    _, labels_path = _split_files(name, split, data_dir, False)
    labels = read_idx(labels_path)
    if labels.ndim != 1:
        raise DatasetError(f"{labels_path.parent}: {split} labels must be one-dimensional, got {labels.shape}")
    require_examples(len(labels), name, split, labels_path)
    return _integer_labels(labels, labels_path.parent, split)


def _nchw_shape(shape) -> tuple:
    """An IDX image shape as (N, C, H, W): a 3-D file holds one channel."""
    return (shape[0], 1) + tuple(shape[1:]) if len(shape) == 3 else tuple(shape)


def _integer_labels(labels, folder, split):
    if labels.dtype.kind not in "iu":
        raise DatasetError(f"{folder}: {split} labels must be integers, got {labels.dtype}")
    return labels.astype(np.int64)


def _split_files(name, split, data_dir, download_missing):
    """The (images, labels) IDX paths of one split, downloading a known dataset where allowed."""
    if split not in SPLIT_FILES:
        raise ValueError(f"load_dataset: split must be 'train' or 'test', got {split!r}")
    folder = find_dataset_dir(name, data_dir)
    if folder is None:
        _check_downloadable(name, data_dir, download_missing)
        try:
            folder = download(name, cache_root() / name)
        except DatasetError as exc:
            raise DatasetError(_missing_message(name, data_dir, f"offline or the mirrors failed: {exc}")) from exc
    return tuple(_find_file(folder, stem) for stem in SPLIT_FILES[split])


def check_idx_available(name: str, data_dir=None, download_missing: bool | None = None) -> None:
    """DatasetError, as loading would raise it, where no folder holds the IDX files of ``name`` and
    they may not be downloaded; nothing is read or downloaded."""
    if find_dataset_dir(name, data_dir) is None:
        _check_downloadable(name, data_dir, download_missing)


def _check_downloadable(name, data_dir, download_missing) -> None:
    """DatasetError unless the missing dataset ``name`` is a known one that may be downloaded."""
    if name not in KNOWN:
        from .registry import unknown_dataset_reason  # (the registry imports this module)

        raise DatasetError(_missing_message(name, data_dir, f"{unknown_dataset_reason(name)}; and no folder "
                                                            "holds its files as an IDX dataset"))
    if not (downloads_allowed() if download_missing is None else download_missing):
        raise DatasetError(_missing_message(name, data_dir, "downloads are off"))


def load_mnist(split: str = "train", data_dir=None, download_missing: bool | None = None):
    """MNIST images (N, 1, 28, 28) uint8 and labels (N,) int64; see ``load_idx_dataset``."""
    return load_idx_dataset("mnist", split, data_dir, download_missing)


def load_fashion_mnist(split: str = "train", data_dir=None, download_missing: bool | None = None):
    """Fashion-MNIST images (N, 1, 28, 28) uint8 and labels (N,) int64; see ``load_idx_dataset``."""
    return load_idx_dataset("fashion-mnist", split, data_dir, download_missing)
