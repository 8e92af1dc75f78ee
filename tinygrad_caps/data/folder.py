"""Any folder of images: ``ROOT/train/<class>/*.png|jpg|...`` and ``ROOT/test/<class>/...``.

Images are decoded with Pillow (the ``images`` extra), converted to grayscale or RGB and resized
to ``image_size`` x ``image_size`` (bilinear, aspect ratio not kept). The decoded uint8 arrays are
cached as ``.npy`` under ``<cache root>/imagefolder/``, keyed by the folder, the split, the size,
the channels and every file's name, size and modification time, so the second run starts at once
and any change to the folder decodes it again.
"""
from __future__ import annotations

import hashlib
import io
import json
import stat as stat_module
import warnings
from pathlib import Path

import numpy as np

from ..errors import NPY_HEADER_ERRORS
from .cache import cache_root, write_atomically
from .errors import DatasetError, DatasetOptionError
from .idx import meminfo_available_bytes
from .labels import MIN_CLASSES

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
GIB = 1024 ** 3


def _split_dir(root, split: str) -> Path:
    if root is None:
        raise DatasetError("dataset 'imagefolder' needs --data-dir PATH, with PATH/train/<class>/ and "
                           "PATH/test/<class>/")
    folder = Path(root) / split
    if not folder.is_dir():
        raise DatasetError(f"{folder}: the image folder has no {split!r} split (expected {folder}/<class>/<images>)")
    return folder


def check_image_folder_split(root, split: str, image_size: int | None = None, channels: int | None = None) -> None:
    """DatasetError, as loading would raise it, where the image folder ``root`` has no ``split``
    folder; with ``image_size`` and ``channels``, also the DatasetOptionError of a split whose decoded
    images would not fit in the memory available. No image is read (the folders are listed)."""
    folder = _split_dir(root, split)
    if image_size is not None and channels is not None:
        _check_decoded_size(folder, _image_count(folder), image_size, channels)


def image_folder_count(root, split: str) -> int:
    """The image files of ``split`` in the image folder ``root``, counted without reading them."""
    return _image_count(_split_dir(root, split))


def _image_count(folder: Path) -> int:
    """The image files in the class folders of ``folder``, counted without checking them (loading
    refuses a bad one with its own message)."""
    return sum(1 for class_dir in folder.iterdir() if class_dir.is_dir()
               for p in class_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def folder_classes(root) -> list[str]:
    """The class names of an image folder: the sorted sub-folders of ``root/train``."""
    classes = sorted(p.name for p in _split_dir(root, "train").iterdir() if p.is_dir())
    if not classes:
        raise DatasetError(f"{Path(root) / 'train'}: no class folders in it")
    if len(classes) < MIN_CLASSES:
        raise DatasetError(f"{Path(root) / 'train'}: a single class folder ({classes[0]}); a classifier needs at "
                           f"least {MIN_CLASSES}")
    return classes


def _image_stat(path: Path):
    """``path``'s stat, for an image that must be a readable regular file (a symlink loop, a dangling
    link or a FIFO named like an image is refused, as an undecodable image is)."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise DatasetError(f"{path}: unreadable image ({exc.strerror or exc})") from exc
    if not stat_module.S_ISREG(stat.st_mode):
        raise DatasetError(f"{path}: unreadable image (not a regular file)")
    return stat


def _listing(folder: Path, classes: list[str]) -> list[tuple[str, int, int, int]]:
    """(relative path, class index, size, mtime_ns) of every image file, sorted by path."""
    entries = []
    present = sorted(p.name for p in folder.iterdir() if p.is_dir())
    unknown = [name for name in present if name not in classes]
    if unknown:
        raise DatasetError(f"{folder}: class folder(s) {', '.join(unknown)} are not among the training classes")
    for index, name in enumerate(classes):
        class_dir = folder / name
        if not class_dir.is_dir():
            continue
        # is_dir() is False for a symlink loop: such entries reach _image_stat, which refuses them
        files = sorted(p for p in class_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        folders = [p for p in files if p.is_dir()]
        if folders:
            raise DatasetError(f"{folders[0]}: unreadable image (a folder, not a file)")
        if not files:
            raise DatasetError(f"{class_dir}: the class {name!r} holds no images ({', '.join(IMAGE_SUFFIXES)})")
        for p in files:
            stat = _image_stat(p)
            entries.append((f"{name}/{p.name}", index, stat.st_size, stat.st_mtime_ns))
    if not entries:
        raise DatasetError(f"{folder}: no images in it")
    return entries


def _decode(path: Path, image_size: int, channels: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        # Pillow warns on the way to its DecompressionBombError limit (twice as many pixels): such an
        # image is decoded, or refused for its data, without a warning line of its own on stderr
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image = image.convert("L" if channels == 1 else "RGB")
                image = image.resize((image_size, image_size), Image.BILINEAR)
                array = np.asarray(image, dtype=np.uint8)
    except Image.DecompressionBombError as exc:  # a header declaring more pixels than Pillow decodes
        raise DatasetError(f"{path}: refused: {exc}") from exc
    except (UnidentifiedImageError, OSError, ValueError, EOFError, SyntaxError) as exc:  # SyntaxError: a bad PNG chunk
        raise DatasetError(f"{path}: unreadable image ({str(exc) or type(exc).__name__})") from exc
    except MemoryError as exc:
        raise MemoryError(f"decoding {path} into a {channels}x{image_size}x{image_size} image") from exc
    return array[None] if channels == 1 else np.moveaxis(array, -1, 0)


def _check_decoded_size(folder: Path, count: int, image_size: int, channels: int) -> None:
    """Refuse, before decoding anything, an ``--image-size`` whose decoded split cannot fit in memory."""
    # the stacked uint8 images, plus one image in decoding (Pillow keeps 4 bytes a pixel, then NumPy's copy)
    needed = count * channels * image_size ** 2 + (4 + channels) * image_size ** 2
    available = meminfo_available_bytes()
    if available is not None and needed > available:
        raise DatasetOptionError(f"--image-size {image_size}: the {count} images of {folder} decoded to {channels}x"
                                 f"{image_size}x{image_size} need {needed / GIB:,.1f} GiB, and {available / GIB:,.1f} "
                                 "GiB of memory is available; use a smaller --image-size")


def _save_npy_atomically(target: Path, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, array)
    write_atomically(target, buffer.getvalue())


def _load_cached(images_path, labels_path):
    """The cached (images, labels) arrays, or None when either file is missing or damaged (then they are rebuilt)."""
    if not (images_path.is_file() and labels_path.is_file()):
        return None
    try:
        return np.load(images_path, allow_pickle=False), np.load(labels_path, allow_pickle=False)
    except (OSError, EOFError, *NPY_HEADER_ERRORS):
        return None


def load_image_folder(root, split: str = "train", image_size: int = 32, channels: int = 3):
    """Decode (or read from the cache) one split of an image folder.

    Returns:
        (images, labels): uint8 (N, channels, image_size, image_size) and int64 (N,), the labels
        being indices into ``folder_classes(root)``.
    Raises:
        DatasetError naming the missing split, the empty class or the unreadable image;
        DatasetOptionError when the decoded split would not fit in the memory available.
    """
    if split not in ("train", "test"):
        raise ValueError(f"load_image_folder: split must be 'train' or 'test', got {split!r}")
    if channels not in (1, 3):
        raise ValueError(f"load_image_folder: channels must be 1 or 3, got {channels}")
    if image_size < 1:
        raise ValueError(f"load_image_folder: image_size must be positive, got {image_size}")
    try:
        import PIL  # noqa: F401
    except ImportError as exc:
        raise DatasetError("image folders need Pillow: pip install 'tinygrad-caps[images]'") from exc
    classes = folder_classes(root)
    folder = _split_dir(root, split)
    entries = _listing(folder, classes)
    if split == "train" and (Path(root) / "test").is_dir():
        _listing(Path(root) / "test", classes)  # refuse a bad test split before the training split is cached
    identity = [str(folder.resolve()), image_size, channels, classes, entries]
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()
    cache_dir = cache_root() / "imagefolder"
    images_path, labels_path = cache_dir / f"{key[:32]}-images.npy", cache_dir / f"{key[:32]}-labels.npy"
    cached = _load_cached(images_path, labels_path)
    if cached is not None and cached[0].shape == (len(entries), channels, image_size, image_size) \
            and cached[1].shape == (len(entries),):
        return cached
    _check_decoded_size(folder, len(entries), image_size, channels)
    images = np.empty((len(entries), channels, image_size, image_size), np.uint8)  # filled in place: no second copy
    for k, (relative, *_) in enumerate(entries):
        images[k] = _decode(folder / relative, image_size, channels)
    labels = np.asarray([index for _, index, *_ in entries], dtype=np.int64)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _save_npy_atomically(images_path, images)
    _save_npy_atomically(labels_path, labels)
    return images, labels
