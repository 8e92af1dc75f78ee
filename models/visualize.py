"""What a trained CapsNet learned, as pictures: reconstructions, the pose-perturbation grid of
Sabour et al. (2017) Fig. 4, and robustness to rotation and translation (with a second model's
curve and a rotated strip, optionally an animated GIF). Each picture comes with a JSON file of
the numbers drawn. ``tinygrad-caps visualize`` parses its options and calls ``visualize``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps import functional as F
from tinygrad_caps.data import affine_bilinear

from .baseline_cnn import BaselineCNN
from .errors import UsageError
from .plots import pyplot
from .training import checkpoint_dataset_spec, limited, load_checkpoint_model

WHATS = ("reconstructions", "perturbation", "robustness")
DEFAULT_COUNTS = {"reconstructions": 16, "perturbation": 3, "robustness": 500}
TWEAKS = np.round(np.arange(-0.25, 0.25 + 1e-9, 0.05), 2)  # Sabour et al. Fig. 4: [-0.25, 0.25] in steps of 0.05
ROTATIONS = np.arange(-60, 61, 10)  # degrees
TRANSLATIONS = np.arange(0, 7)  # pixels of the stored image (before any crop)
# Image k of a translated batch moves right, down, left, up for k % 4 = 0, 1, 2, 3: one pass per
# distance averages over the four directions.
DIRECTIONS = np.array([(0, 1), (1, 0), (0, -1), (-1, 0)])


def _pyplot():
    plt = pyplot()
    if plt is None:
        raise RuntimeError("pictures need matplotlib: pip install 'tinygrad-caps[viz]'")
    return plt


def _require_capsnet(model, what: str):
    if isinstance(model, BaselineCNN):
        raise UsageError(f"{what} needs a CapsNet checkpoint; the baseline CNN has no capsules or decoder")


def display_image(chw) -> np.ndarray:
    """A (C, H, W) model input or reconstruction as something ``imshow`` draws: (H, W) for 1 channel,
    (H, 2W) with the two views side by side for 2 (smallNORB), (H, W, 3) for 3; scaled to [0, 1]
    by its own minimum and maximum unless already inside [0, 1]."""
    chw = np.asarray(chw, dtype=np.float32)
    if chw.ndim != 3 or chw.shape[0] not in (1, 2, 3):
        raise ValueError(f"display_image: expected (C, H, W) with C in 1..3, got {chw.shape}")
    low, high = float(chw.min()), float(chw.max())
    if low < 0 or high > 1:  # standardized inputs
        chw = (chw - low) / max(high - low, 1e-6)
    if chw.shape[0] == 3:
        return np.moveaxis(chw, 0, -1)
    return np.concatenate(list(chw), axis=1)


def _imshow(ax, chw):
    picture = display_image(chw)
    ax.imshow(picture, cmap=None if picture.ndim == 3 else "gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def _rounded(array) -> list:
    return np.round(np.asarray(array, dtype=np.float64), 4).tolist()


def capsule_outputs(model, x, batch_size: int = 100):
    """Run a CapsNet (eval mode, no grad) on float inputs x (N, C, H, W).

    Returns:
        v (N, num_classes, digit_dim), lengths (N, num_classes), predicted (N,) and the
        reconstructions (N, C, H, W) masked by the predicted class.
    """
    _require_capsnet(model, "capsule_outputs")
    model.eval()
    parts = []
    with tc.no_grad():
        for start in range(0, len(x), batch_size):
            v, lengths, recon = model(tc.tensor(x[start:start + batch_size], device=model.device))
            parts.append((v.numpy(), lengths.numpy(), recon.numpy()))
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
    _require_capsnet(model, "decode")
    config = model.config
    with tc.no_grad():
        v = tc.tensor(np.asarray(v, dtype=np.float32), device=model.device).astype(model.digit.weight.dtype)
        mask = F.one_hot(tc.backend.asarray_like(np.asarray(classes), v.data), config["num_classes"], dtype=v.dtype)
        out = model.decoder(F.reshape(v * F.expand_dims(mask, -1), (v.shape[0], -1))).numpy()
    return out.reshape(len(out), config["in_channels"], config["image_size"], config["image_size"])


def perturbation_grids(model, x, tweaks=TWEAKS) -> tuple[np.ndarray, np.ndarray]:
    """Sabour et al. (2017) Fig. 4: each dimension of the predicted class's capsule tweaked.

    Args:
        x: (N, C, H, W) model inputs. tweaks: (T,) values added to one dimension at a time.
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
                      translations=TRANSLATIONS) -> dict:
    """Test accuracy of each model in ``models`` (name -> model) under each rotation and translation.

    The stored images (N, C, H, W) are moved first (``transformed``, zero fill: the background of
    the stored pixels) and then ``preprocess``-ed as at test time (a dataset's ``test_preprocess``),
    so standardization and centre crops see the moved image, identically for every model.

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


def draw_reconstructions(path, inputs, reconstructions, labels, predicted, class_names) -> None:
    """PNG: ``inputs`` (N, C, H, W) on the top row, their reconstructions below, predicted class above."""
    plt = _pyplot()
    count = len(inputs)
    fig, axes = plt.subplots(2, count, figsize=(1.1 * count * (2 if inputs.shape[1] == 2 else 1), 2.6), squeeze=False)
    for k in range(count):
        _imshow(axes[0, k], inputs[k])
        _imshow(axes[1, k], reconstructions[k])
        axes[0, k].set_title(str(class_names[predicted[k]])[:10], fontsize=7,
                             color="black" if predicted[k] == labels[k] else "red")
    axes[0, 0].set_ylabel("input", fontsize=8)
    axes[1, 0].set_ylabel("reconstruction", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def draw_perturbation(path, grids, predicted, class_names, tweaks=TWEAKS) -> None:
    """PNG: one grid per image (rows: capsule dimensions, columns: tweaks), side by side."""
    plt = _pyplot()
    n, dim, steps = grids.shape[:3]
    tiles = np.array([[[display_image(grids[k, d, t]) for t in range(steps)] for d in range(dim)] for k in range(n)])
    h, w = tiles.shape[3], tiles.shape[4]
    panel_width = 0.45 * steps * w / h
    fig, axes = plt.subplots(1, n, figsize=(panel_width * n + 0.8 * n, 0.45 * dim + 1.6), squeeze=False)
    for k in range(n):
        # tiles in RGB with one orange pixel between them, visible whatever the reconstructions look like
        rgb = tiles[k] if tiles.ndim == 6 else np.repeat(tiles[k][..., None], 3, axis=-1)
        padded = np.ones(rgb.shape[:2] + (h + 1, w + 1, 3), np.float32) * np.array([1.0, 0.55, 0.0], np.float32)
        padded[:, :, :h, :w] = rgb
        mosaic = np.concatenate([np.concatenate(list(padded[d]), axis=1) for d in range(dim)], axis=0)
        ax = axes[0, k]
        ax.imshow(mosaic, interpolation="nearest")
        ax.set_xticks(np.arange(steps) * (w + 1) + w / 2 - 0.5, [f"{t:+.2f}" for t in tweaks], rotation=90, fontsize=6)
        ax.set_yticks(np.arange(dim) * (h + 1) + h / 2 - 0.5, [str(d) for d in range(dim)], fontsize=6)
        ax.set_xlabel("tweak", fontsize=8)
        ax.set_ylabel("capsule dimension", fontsize=8)
        ax.set_title(f"predicted: {class_names[predicted[k]]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def draw_robustness(path, curves: dict, strip: dict, class_names) -> None:
    """PNG: accuracy against rotation and translation (one curve per model) above the rotated strip
    (frames, predicted class and length, reconstructions)."""
    plt = _pyplot()
    frames = strip["frames"]
    steps = len(frames)
    has_recon = strip["reconstructions"] is not None
    views = 2 if frames.shape[1] == 2 else 1
    width = max(12.0, 1.0 * steps * views)
    tile = 0.93 * width / steps / views  # inches: the height of one frame
    heights = [3.2, 0.25, tile + 0.45] + [tile] * has_recon
    fig = plt.figure(figsize=(width, sum(heights) + 0.9))
    grid = fig.add_gridspec(3 + has_recon, steps, height_ratios=heights, hspace=0.35)
    half = steps // 2
    for col, (key, label) in enumerate((("rotation", "rotation (degrees)"), ("translation", "translation (pixels)"))):
        ax = fig.add_subplot(grid[0, :half] if col == 0 else grid[0, half + 1:])
        xs = curves["rotation_degrees" if key == "rotation" else "translation_pixels"]
        for name, accuracy in curves["accuracy"].items():
            ax.plot(xs, accuracy[key], marker="o", label=name)
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for k in range(steps):
        ax = fig.add_subplot(grid[2, k])
        _imshow(ax, frames[k])
        title = str(class_names[strip["predicted"][k]])[:9]
        if strip["lengths"] is not None:
            title += f"\n{strip['lengths'][k].max():.2f}"
        ax.set_title(f"{strip['rotations'][k]:+d}°\n{title}", fontsize=7)
        if k == 0:
            ax.set_ylabel("rotated", fontsize=8)
        if has_recon:
            ax = fig.add_subplot(grid[3, k])
            _imshow(ax, strip["reconstructions"][k])
            if k == 0:
                ax.set_ylabel("reconstruction", fontsize=8)
    fig.subplots_adjust(left=0.05, right=0.98, top=0.97, bottom=0.02)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_rotation_gif(path, strip: dict, class_names, scale: int = 4) -> None:
    """Animated GIF of the strip: each frame the rotated input (and its reconstruction) with the
    predicted class written under it. Needs Pillow (the ``images`` extra)."""
    try:
        from PIL import Image, ImageDraw
    except ImportError as exc:
        raise RuntimeError("--gif needs Pillow: pip install 'tinygrad-caps[images]'") from exc
    pictures = []
    for k in range(len(strip["frames"])):
        parts = [display_image(strip["frames"][k])]
        if strip["reconstructions"] is not None:
            parts.append(display_image(strip["reconstructions"][k]))
        row = np.concatenate(parts, axis=1)
        pixels = np.uint8(np.clip(row, 0, 1) * 255).repeat(scale, axis=0).repeat(scale, axis=1)
        image = Image.fromarray(pixels).convert("RGB")
        canvas = Image.new("RGB", (image.width, image.height + 14), "white")
        canvas.paste(image, (0, 0))
        ImageDraw.Draw(canvas).text((2, image.height + 1), f"{strip['rotations'][k]:+d} deg: "
                                    f"{class_names[strip['predicted'][k]]}", fill="black")
        pictures.append(canvas)
    pictures[0].save(path, save_all=True, append_images=pictures[1:], duration=400, loop=0)


def write_reconstructions(model, x, labels, class_names, out) -> dict:
    """Draw inputs x (N, C, H, W) above their reconstructions (masked by the prediction) into the
    PNG ``out``; returns the numbers drawn (predicted, lengths, inputs, reconstructions)."""
    _require_capsnet(model, "reconstructions")
    _, lengths, predicted, recon = capsule_outputs(model, x)
    draw_reconstructions(out, x, recon, labels, predicted, class_names)
    return {"predicted": predicted.tolist(), "lengths": _rounded(lengths), "inputs": _rounded(x),
            "reconstructions": _rounded(recon)}


def visualize(checkpoint, what: str, out, dataset=None, data_dir=None, count=None, compare=None, gif: bool = False,
              device: str = "auto", log=print) -> dict:
    """Draw ``what`` ("reconstructions", "perturbation" or "robustness") for ``checkpoint`` into the
    PNG ``out`` and write the numbers drawn to ``out`` with the suffix ``.json``.

    The test images are the first ``count`` of ``dataset`` (default: the checkpoint's), preprocessed
    as the registry says; ``compare`` adds a second checkpoint's robustness curves; ``gif`` also
    writes the rotated strip as ``out`` with the suffix ``.gif``. Returns the JSON's content.
    """
    if what not in WHATS:
        raise UsageError(f"visualize: --what must be one of {WHATS}, got {what!r}")
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise UsageError(f"visualize: --out must name a .png file, got {out}")
    if count is not None and count < 1:
        raise UsageError(f"visualize: --count must be positive, got {count}")
    if gif and what != "robustness":
        raise UsageError("visualize: --gif goes with --what robustness")
    if compare and what != "robustness":
        raise UsageError("visualize: --compare goes with --what robustness")
    count = count or DEFAULT_COUNTS[what]
    for path in (checkpoint, compare):
        if path is not None and not Path(path).is_file():
            raise UsageError(f"{path}: no such checkpoint")
    model, config = load_checkpoint_model(checkpoint, device=device)
    name = dataset or config["dataset"]
    data_dir = data_dir or config.get("data_dir")
    spec = checkpoint_dataset_spec(config, name, data_dir, checkpoint)
    images, labels = limited(*spec.load("test", data_dir), count)
    x = spec.preprocess(images)
    classes = list(spec.classes)
    record = {"what": what, "checkpoint": str(checkpoint), "dataset": name, "classes": classes,
              "count": int(len(x)), "labels": labels.tolist()}
    out.parent.mkdir(parents=True, exist_ok=True)
    if what == "reconstructions":
        record.update(write_reconstructions(model, x, labels, classes, out))
    elif what == "perturbation":
        _require_capsnet(model, "--what perturbation")
        grids, predicted = perturbation_grids(model, x)
        draw_perturbation(out, grids, predicted, classes)
        record.update(predicted=predicted.tolist(), tweaks=TWEAKS.tolist(),
                      grid_shape=["image", "dimension", "tweak", "channel", "row", "column"],
                      grids=_rounded(grids))
    else:
        models = {f"{config.get('model') or 'capsnet'} ({Path(checkpoint).name})": model}
        if compare:
            other, other_config = load_checkpoint_model(compare, device=device)
            spec.check_model(other_config["in_channels"], other_config["image_size"], other_config["num_classes"],
                             f"--compare checkpoint {compare}")
            label = f"{other_config.get('model') or 'capsnet'} ({Path(compare).name})"
            models[label if label not in models else f"{label} [compare]"] = other
        curves = robustness_curves(models, images, labels, spec.test_preprocess)
        strip = rotation_strip(model, images[0], spec.test_preprocess)
        strip["rotations"] = [int(r) for r in ROTATIONS]
        draw_robustness(out, curves, strip, classes)
        record.update(curves, strip={"label": int(labels[0]), "rotation_degrees": strip["rotations"],
                                     "predicted": strip["predicted"].tolist(),
                                     "lengths": None if strip["lengths"] is None else _rounded(strip["lengths"]),
                                     "frames": _rounded(strip["frames"]),
                                     "reconstructions": None if strip["reconstructions"] is None
                                     else _rounded(strip["reconstructions"])})
        if gif:
            write_rotation_gif(out.with_suffix(".gif"), strip, classes)
            record["gif"] = str(out.with_suffix(".gif"))
    out.with_suffix(".json").write_text(json.dumps(record))
    log(f"{what} written to {out} and {out.with_suffix('.json')}")
    return record
