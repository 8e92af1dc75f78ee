"""What a trained CapsNet learned, read from the model: capsule outputs, predictions, decoded
poses, the pose-perturbation grids of Sabour et al. (2017) Fig. 4, robustness to rotation and
translation, and the rotated strip; each takes a model (loading checkpoints is the app's business).
"""
from __future__ import annotations

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps import functional as F
from tinygrad_caps.data import affine_bilinear

from ..capsnet.baseline_cnn import BaselineCNN
from ..errors import UsageError
from .pictures import TWEAKS, draw_reconstructions

ROTATIONS = np.arange(-60, 61, 10)  # degrees
TRANSLATIONS = np.arange(0, 7)  # pixels of the stored image (before any crop)
# Image k of a translated batch moves right, down, left, up for k % 4 = 0, 1, 2, 3: one pass per
# distance averages over the four directions.
DIRECTIONS = np.array([(0, 1), (1, 0), (0, -1), (-1, 0)])


def require_capsnet(model, what: str):
    if isinstance(model, BaselineCNN):
        raise UsageError(f"{what} needs a CapsNet checkpoint; the baseline CNN has no capsules or decoder")


def rounded(array) -> list:
    return np.round(np.asarray(array, dtype=np.float64), 4).tolist()


def capsule_outputs(model, x, batch_size: int = 100, progress=None):
    """Run a CapsNet (eval mode, no grad) on float inputs x (N, C, H, W); ``progress`` (a tqdm bar or
    None) is advanced by each batch's size.

    Returns:
        v (N, num_classes, digit_dim), lengths (N, num_classes), predicted (N,) and the
        reconstructions (N, C, H, W) masked by the predicted class.
    """
    require_capsnet(model, "capsule_outputs")
    model.eval()
    parts = []
    with tc.no_grad():
        for start in range(0, len(x), batch_size):
            v, lengths, recon = model(tc.tensor(x[start:start + batch_size], device=model.device))
            parts.append((v.numpy(), lengths.numpy(), recon.numpy()))
            if progress is not None:
                progress.update(len(parts[-1][0]))
    v, lengths, recon = (np.concatenate(p) for p in zip(*parts))
    return v, lengths, lengths.argmax(axis=1), recon.reshape(x.shape)


def predict(model, x, batch_size: int = 100) -> np.ndarray:
    """Predicted classes (N,) of any model our CLI trains (CapsNet: longest capsule; CNN: largest logit)."""
    model.eval()
    predicted = []
    with tc.no_grad():
        for start in range(0, len(x), batch_size):
            batch = tc.tensor(x[start:start + batch_size], device=model.device)
            scores = model(batch) if isinstance(model, BaselineCNN) else model(batch)[1]
            predicted.append(scores.numpy().argmax(axis=1))
    return np.concatenate(predicted)


def decode(model, v, classes) -> np.ndarray:
    """Reconstruct from capsule outputs v (N, num_classes, digit_dim) masked to ``classes`` (N,):
    returns (N, C, H, W)."""
    require_capsnet(model, "decode")
    config = model.config
    with tc.no_grad():
        v = tc.tensor(np.asarray(v, dtype=np.float32), device=model.device).astype(model.digit.weight.dtype)
        mask = F.one_hot(tc.backend.asarray_like(np.asarray(classes), v.data), config["num_classes"], dtype=v.dtype)
        out = model.decoder(F.reshape(v * F.expand_dims(mask, -1), (v.shape[0], -1))).numpy()
    return out.reshape(len(out), config["in_channels"], config["image_size"], config["image_size"])


def perturbation_grids(model, x, tweaks=TWEAKS, progress=None) -> tuple[np.ndarray, np.ndarray]:
    """Sabour et al. (2017) Fig. 4: each dimension of the predicted class's capsule tweaked.

    Args:
        x: (N, C, H, W) model inputs. tweaks: (T,) values added to one dimension at a time.
        progress: a tqdm bar (or None), advanced by one per image decoded.
    Returns:
        grids (N, digit_dim, T, C, H, W), the reconstruction with dimension d changed by
        tweaks[t]; and the predicted classes (N,).
    """
    v, _, predicted, _ = capsule_outputs(model, x)
    n, _, dim = v.shape
    tweaks = np.asarray(tweaks, dtype=np.float32)
    grids = []
    for k in range(n):
        tweaked = np.repeat(v[k][None], dim * len(tweaks), axis=0).reshape(dim, len(tweaks), *v.shape[1:])
        tweaked[np.arange(dim), :, predicted[k], np.arange(dim)] += tweaks  # (dim, T) entries
        flat = tweaked.reshape(dim * len(tweaks), *v.shape[1:])
        grids.append(decode(model, flat, np.full(len(flat), predicted[k])).reshape(dim, len(tweaks), *x.shape[1:]))
        if progress is not None:
            progress.update(1)
    return np.stack(grids), predicted


def transformed(x, degrees: float = 0.0, distance: float = 0.0) -> np.ndarray:
    """x (N, C, H, W) rotated by ``degrees``, then image k moved ``distance`` pixels along
    DIRECTIONS[k % 4]; bilinear, zero fill (the same for every model compared)."""
    x = affine_bilinear(x, degrees) if degrees else np.asarray(x, dtype=np.float32)
    if not distance:
        return x
    out = np.empty_like(x)
    for j, (dy, dx) in enumerate(DIRECTIONS):
        out[j::4] = affine_bilinear(x[j::4], 0.0, (dy * distance, dx * distance))
    return out


def robustness_curves(models: dict, images, labels, preprocess, rotations=ROTATIONS,
                      translations=TRANSLATIONS, progress=None) -> dict:
    """Test accuracy of each model in ``models`` (name -> model) under each rotation and translation.

    The stored images (N, C, H, W) are moved first (``transformed``, zero fill: the background of
    the stored pixels) and then ``preprocess``-ed as at test time (a dataset's ``test_preprocess``),
    so standardization and centre crops see the moved image, identically for every model.

    ``progress`` (a tqdm bar or None) is advanced by the number of images of each model's pass.

    Returns:
        {"rotation_degrees": [...], "translation_pixels": [...], "accuracy": {name: {"rotation":
        [...], "translation": [...]}}}.
    """
    result = {"rotation_degrees": [int(r) for r in rotations], "translation_pixels": [int(t) for t in translations],
              "accuracy": {name: {"rotation": [], "translation": []} for name in models}}
    for key, values, make in (("rotation", rotations, lambda r: transformed(images, degrees=r)),
                              ("translation", translations, lambda t: transformed(images, distance=t))):
        for value in values:
            moved = preprocess(make(value))
            for name, model in models.items():
                result["accuracy"][name][key].append(float((predict(model, moved) == labels).mean()))
                if progress is not None:
                    progress.update(len(labels))
    return result


def rotation_strip(model, image, preprocess, rotations=ROTATIONS) -> dict:
    """One stored image (C, H, W) rotated step by step and preprocessed: frames (R, C', S, S) (the
    model's inputs), predicted classes (R,), capsule lengths (R, num_classes) and, for a CapsNet,
    reconstructions (R, C', S, S) (else None)."""
    frames = preprocess(np.concatenate([transformed(image[None], degrees=r) for r in rotations]))
    if isinstance(model, BaselineCNN):
        return {"frames": frames, "predicted": predict(model, frames), "lengths": None, "reconstructions": None}
    _, lengths, predicted, recon = capsule_outputs(model, frames)
    return {"frames": frames, "predicted": predicted, "lengths": lengths, "reconstructions": recon}


def write_reconstructions(model, x, labels, class_names, out, progress=None) -> dict:
    """Draw inputs x (N, C, H, W) above their reconstructions (masked by the prediction) into the
    picture ``out``; returns the numbers drawn: the class names, the true labels, the predicted
    classes, the capsule lengths, the inputs and the reconstructions."""
    require_capsnet(model, "reconstructions")
    _, lengths, predicted, recon = capsule_outputs(model, x, progress=progress)
    draw_reconstructions(out, x, recon, labels, predicted, class_names)
    return {"classes": [str(name) for name in class_names], "labels": np.asarray(labels).tolist(),
            "predicted": predicted.tolist(), "lengths": rounded(lengths), "inputs": rounded(x),
            "reconstructions": rounded(recon)}
