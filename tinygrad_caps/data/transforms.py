"""Image transforms in NumPy on batches (N, C, H, W): resizing, crops, standardization, jitter,
and bilinear rotation/translation (the robustness study applies these identically to every model)."""
from __future__ import annotations

import numpy as np


def _check_batch(name: str, images) -> np.ndarray:
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"{name}: expected images of shape (N, C, H, W), got {images.shape}")
    return images


def downsample_by_mean(images, factor: int) -> np.ndarray:
    """Average ``factor`` x ``factor`` blocks: (N, C, H, W) -> (N, C, H/factor, W/factor), same dtype
    (uint8 rounded). H and W must be multiples of ``factor``."""
    images = _check_batch("downsample_by_mean", images)
    n, c, h, w = images.shape
    if factor < 1 or h % factor or w % factor:
        raise ValueError(f"downsample_by_mean: {h}x{w} images cannot be reduced by a factor {factor}")
    blocks = images.reshape(n, c, h // factor, factor, w // factor, factor).astype(np.float32).mean(axis=(3, 5))
    return np.rint(blocks).astype(images.dtype) if images.dtype == np.uint8 else blocks.astype(images.dtype)


def center_crop(images, size: int) -> np.ndarray:
    """The central ``size`` x ``size`` window of each image: (N, C, H, W) -> (N, C, size, size)."""
    images = _check_batch("center_crop", images)
    h, w = images.shape[2:]
    if not 0 < size <= min(h, w):
        raise ValueError(f"center_crop: cannot take {size}x{size} from {h}x{w} images")
    top, left = (h - size) // 2, (w - size) // 2
    return images[:, :, top:top + size, left:left + size]


def crop_at(images, size: int, tops, lefts) -> np.ndarray:
    """The ``size`` x ``size`` window at (tops[k], lefts[k]) of image k: (N, C, H, W) -> (N, C, size, size)."""
    images = _check_batch("crop_at", images)
    n, c, h, w = images.shape
    tops, lefts = np.asarray(tops), np.asarray(lefts)
    if tops.shape != (n,) or lefts.shape != (n,):
        raise ValueError(f"crop_at: {n} images but offsets of shapes {tops.shape} and {lefts.shape}")
    if not 0 < size <= min(h, w) or n and (tops.min() < 0 or lefts.min() < 0 or tops.max() > h - size
                                          or lefts.max() > w - size):
        raise ValueError(f"crop_at: {size}x{size} windows at these offsets do not fit {h}x{w} images")
    rows = tops[:, None] + np.arange(size)  # (N, size)
    cols = lefts[:, None] + np.arange(size)
    return images[np.arange(n)[:, None, None, None], np.arange(c)[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]


def random_crop_offsets(count: int, height: int, width: int, size: int, rng: np.random.Generator):
    """(tops, lefts), each (count,), uniform over the windows of ``size`` inside height x width."""
    if not 0 < size <= min(height, width):
        raise ValueError(f"random_crop: cannot take {size}x{size} from {height}x{width} images")
    return rng.integers(0, height - size + 1, size=count), rng.integers(0, width - size + 1, size=count)


def random_crop(images, size: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly placed ``size`` x ``size`` window per image: (N, C, H, W) -> (N, C, size, size)."""
    images = _check_batch("random_crop", images)
    n, _, h, w = images.shape
    return crop_at(images, size, *random_crop_offsets(n, h, w, size, rng))


def standardize(images, eps: float = 1e-6) -> np.ndarray:
    """Each image (all its channels together) to zero mean and unit variance: float32 (N, C, H, W)."""
    images = _check_batch("standardize", images).astype(np.float32)
    mean = images.mean(axis=(1, 2, 3), keepdims=True)
    std = images.std(axis=(1, 2, 3), keepdims=True)
    return (images - mean) / np.maximum(std, eps)


def brightness_contrast(images, offsets, factors) -> np.ndarray:
    """Image k: its deviation from its mean scaled by factors[k], plus offsets[k]. float32 (N, C, H, W)."""
    images = _check_batch("brightness_contrast", images).astype(np.float32)
    n = len(images)
    offsets = np.asarray(offsets, np.float32).reshape(n, 1, 1, 1)
    factors = np.asarray(factors, np.float32).reshape(n, 1, 1, 1)
    mean = images.mean(axis=(1, 2, 3), keepdims=True)
    return (images - mean) * factors + mean + offsets


def jitter_parameters(count: int, rng: np.random.Generator, max_brightness: float, contrast_range):
    """(offsets, factors), each (count,): brightness uniform in [-max_brightness, max_brightness],
    contrast factor uniform in ``contrast_range``."""
    return rng.uniform(-max_brightness, max_brightness, size=count), rng.uniform(*contrast_range, size=count)


def _bilinear_sample(images: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Sample (N, C, H, W) float images at source coordinates ys, xs of shape (H', W'), zero outside."""
    n, c, h, w = images.shape
    y0, x0 = np.floor(ys).astype(np.int64), np.floor(xs).astype(np.int64)
    wy, wx = (ys - y0).astype(np.float32), (xs - x0).astype(np.float32)
    out = np.zeros((n, c) + ys.shape, dtype=np.float32)
    for dy, dx, weight in ((0, 0, (1 - wy) * (1 - wx)), (0, 1, (1 - wy) * wx), (1, 0, wy * (1 - wx)), (1, 1, wy * wx)):
        yy, xx = y0 + dy, x0 + dx
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        out += images[:, :, np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)] * (weight * inside)
    return out


def resize_bilinear(images, size: int) -> np.ndarray:
    """Resize (N, C, H, W) to (N, C, size, size) by bilinear interpolation (pixel centres aligned); float32."""
    images = _check_batch("resize_bilinear", images).astype(np.float32)
    h, w = images.shape[2:]
    ys = np.clip((np.arange(size) + 0.5) * h / size - 0.5, 0, h - 1)
    xs = np.clip((np.arange(size) + 0.5) * w / size - 0.5, 0, w - 1)
    return _bilinear_sample(images, *np.meshgrid(ys, xs, indexing="ij"))


def affine_bilinear(images, degrees: float = 0.0, shift: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """Rotate each image by ``degrees`` (counter-clockwise, about its centre), then translate it by
    ``shift`` = (dy, dx) pixels; bilinear, zero fill. (N, C, H, W) -> float32 (N, C, H, W)."""
    images = _check_batch("affine_bilinear", images).astype(np.float32)
    h, w = images.shape[2:]
    cy, cx = (h - 1) / 2, (w - 1) / 2
    yy, xx = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij")
    # Inverse map: each output pixel reads the source at R^-1 (p - shift - c) + c, with R the
    # counter-clockwise turn on screen written in (row, col) coordinates (rows grow downwards).
    oy, ox = yy - shift[0] - cy, xx - shift[1] - cx
    theta = np.deg2rad(degrees)
    cos, sin = np.cos(theta), np.sin(theta)
    src_y = cos * oy + sin * ox + cy
    src_x = -sin * oy + cos * ox + cx
    return _bilinear_sample(images, src_y, src_x)
