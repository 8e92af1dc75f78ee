"""The pictures of ``tinygrad-caps visualize`` and ``evaluate --reconstructions``: reconstructions,
the pose-perturbation grid, robustness curves with the rotated strip, and the rotation GIF.

Each ``*_figure`` builds the matplotlib figure (for inspection), each ``draw_*`` saves it in the
format its path's suffix names. Figures are laid out in inches from what they hold: class names are
wrapped and never cut, and columns widen to fit them.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from ..errors import UsageError
from .figure_style import no_negative_zero, picture_format

TWEAKS = np.round(np.arange(-0.25, 0.25 + 1e-9, 0.05), 2) + 0.0  # Fig. 4's steps; + 0.0 turns a rounded -0.0 into 0.0
TITLE_POINTS = 7
WRONG = "red"


def pyplot():
    """matplotlib.pyplot on the Agg backend; UsageError where matplotlib is not installed."""
    from .plots import pyplot as plots_pyplot

    plt = plots_pyplot()
    if plt is None:
        raise UsageError("pictures need matplotlib: pip install 'tinygrad-caps[viz]'")
    return plt


def require_libraries(gif: bool = False) -> None:
    """UsageError, before any work, unless matplotlib (and for ``gif`` Pillow) can be imported."""
    pyplot()
    if gif:
        try:
            import PIL.Image  # noqa: F401
        except ImportError:
            raise UsageError("--gif needs Pillow: pip install 'tinygrad-caps[images]'") from None


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


def wrapped(name, width: int = 10) -> str:
    """A class name broken at spaces into lines of about ``width`` characters (a longer word stays whole)."""
    return "\n".join(textwrap.wrap(str(name), width, break_long_words=False, break_on_hyphens=False)) or str(name)


def text_inches(text: str, points: float = TITLE_POINTS) -> tuple:
    """(width, height) in inches that ``text`` needs at ``points`` (a generous estimate: 0.62 em per character)."""
    lines = str(text).split("\n")
    return max(len(line) for line in lines) * points * 0.62 / 72, len(lines) * points * 1.3 / 72


def save_figure(fig, path) -> None:
    """Save ``fig`` to ``path`` (folders made as needed; the format from the suffix) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format=picture_format(path) or "png")
    pyplot().close(fig)


def _axes_at(fig, width, height, left, bottom, w, h):
    """An axes placed in inches (from the figure's lower left corner)."""
    return fig.add_axes([left / width, bottom / height, w / width, h / height])


def reconstruction_title(predicted: int, label: int, class_names) -> str:
    """A column's title: the predicted class, and for a wrong prediction the true one below it."""
    title = wrapped(class_names[predicted])
    return title if predicted == label else f"{title}\n(true: {wrapped(class_names[label])})"


def reconstructions_figure(inputs, reconstructions, labels, predicted, class_names):
    """``inputs`` (N, C, H, W) on the top row, their reconstructions below, the predicted class above
    each column (red, with the true class, where wrong) and a key to the colours under the grid."""
    from matplotlib.patches import Patch

    plt = pyplot()
    count = len(inputs)
    views = 2 if inputs.shape[1] == 2 else 1
    titles = [reconstruction_title(predicted[k], labels[k], class_names) for k in range(count)]
    title_w = max(text_inches(t)[0] for t in titles)
    title_h = max(text_inches(t)[1] for t in titles)
    tile = 0.95
    column = max(1.1 * views, tile * views + 0.15, title_w + 0.15)
    key = ["predicted class, correct", "predicted class, wrong (true class below)"]
    key_w = sum(text_inches(k, 8)[0] + 0.6 for k in key)
    left, grid_w = 0.35, column * count
    width = left + max(grid_w, key_w) + 0.1
    rows_on_key = 1 if key_w <= width - 0.2 else 2
    bottom = 0.2 + 0.2 * rows_on_key
    height = bottom + 2 * tile + 0.15 + title_h + 0.15
    fig = plt.figure(figsize=(width, height))
    start = left + (width - left - 0.1 - grid_w) / 2
    for k in range(count):
        x = start + k * column + (column - tile * views) / 2
        top = _axes_at(fig, width, height, x, bottom + tile + 0.1, tile * views, tile)
        _imshow(top, inputs[k])
        top.set_title(titles[k], fontsize=TITLE_POINTS, color="black" if predicted[k] == labels[k] else WRONG)
        below = _axes_at(fig, width, height, x, bottom, tile * views, tile)
        _imshow(below, reconstructions[k])
        if k == 0:
            top.set_ylabel("input", fontsize=8)
            below.set_ylabel("reconstruction", fontsize=7)
    fig.legend(handles=[Patch(color="black", label=key[0]), Patch(color=WRONG, label=key[1])], loc="lower center",
               ncol=2 if rows_on_key == 1 else 1, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.0))
    return fig


def draw_reconstructions(path, inputs, reconstructions, labels, predicted, class_names) -> None:
    """The picture ``path``: ``inputs`` (N, C, H, W) on the top row, their reconstructions below,
    predicted class above (red with the true class where wrong), a key to the colours."""
    save_figure(reconstructions_figure(inputs, reconstructions, labels, predicted, class_names), path)


def perturbation_figure(grids, predicted, class_names, tweaks=TWEAKS):
    """One grid per image side by side (rows: capsule dimensions, columns: tweaks), thin lines between tiles."""
    plt = pyplot()
    n, dim, steps = grids.shape[:3]
    tiles = np.array([[[display_image(grids[k, d, t]) for t in range(steps)] for d in range(dim)] for k in range(n)])
    h, w = tiles.shape[3], tiles.shape[4]
    size = 0.42  # inches per tile row
    panel_w, panel_h = size * steps * w / h, size * dim
    titles = [f"predicted: {wrapped(class_names[p], max(12, int(panel_w * 72 / (9 * 0.62))))}" for p in predicted]
    title_h = max(text_inches(t, 9)[1] for t in titles)
    left, gap, bottom, top = 0.6, 0.7, 0.75, title_h + 0.2
    width = left + n * panel_w + (n - 1) * gap + 0.15
    height = bottom + panel_h + top
    fig = plt.figure(figsize=(width, height))
    labels = [no_negative_zero(f"{t:+.2f}") for t in tweaks]
    for k in range(n):
        ax = _axes_at(fig, width, height, left + k * (panel_w + gap), bottom, panel_w, panel_h)
        mosaic = np.concatenate([np.concatenate(list(tiles[k, d]), axis=1) for d in range(dim)], axis=0)
        ax.imshow(mosaic, cmap=None if mosaic.ndim == 3 else "gray", vmin=0, vmax=1, interpolation="nearest",
                  aspect="auto")
        for t in range(1, steps):  # hairlines between tiles, visible on dark and light pictures alike
            ax.axvline(t * w - 0.5, color="0.55", linewidth=0.5)
        for d in range(1, dim):
            ax.axhline(d * h - 0.5, color="0.55", linewidth=0.5)
        for side in ax.spines.values():
            side.set_linewidth(0.5)
        ax.set_xticks(np.arange(steps) * w + w / 2 - 0.5, labels, rotation=90, fontsize=6)
        ax.set_yticks(np.arange(dim) * h + h / 2 - 0.5, [str(d) for d in range(dim)], fontsize=6)
        ax.tick_params(length=2)
        ax.set_xlabel("tweak", fontsize=8)
        ax.set_ylabel("capsule dimension", fontsize=8)
        ax.set_title(titles[k], fontsize=9)
    return fig


def draw_perturbation(path, grids, predicted, class_names, tweaks=TWEAKS) -> None:
    """The picture ``path``: one grid per image (rows: capsule dimensions, columns: tweaks), side by side."""
    save_figure(perturbation_figure(grids, predicted, class_names, tweaks), path)


def _length_text(length: float) -> str:
    return f"|v| {length:.2f}" if length >= 0.01 else f"|v| {length:.1e}"


def robustness_figure(curves: dict, strip: dict, class_names):
    """Accuracy against rotation and translation (one curve per model) above the rotated strip
    (frames, predicted class and capsule length, reconstructions). With ``strip["label"]`` (the
    image's true class) wrong predictions are red and a line under the strip names the true class."""
    plt = pyplot()
    frames = strip["frames"]
    steps = len(frames)
    has_recon = strip["reconstructions"] is not None
    views = 2 if frames.shape[1] == 2 else 1
    titles = []
    for k in range(steps):
        title = f"{strip['rotations'][k]:+d}°\n{wrapped(class_names[strip['predicted'][k]])}"
        if strip["lengths"] is not None:
            title += "\n" + _length_text(float(strip["lengths"][k].max()))
        titles.append(title)
    title_w = max(text_inches(t)[0] for t in titles)
    title_h = max(text_inches(t)[1] for t in titles)
    column = max(12.0 / steps, 1.0 * views, title_w + 0.1)
    tile = min(0.93 * column, 0.93 * views) / views  # the height of one frame
    left, width = 0.45, 0.45 + column * steps + 0.1
    curve_h, below_curves = 3.0, 0.75
    true = strip.get("label")
    key_h = 0.3 if true is not None else 0.0
    strip_h = title_h + 0.1 + tile + (tile + 0.1) * has_recon
    height = 0.15 + key_h + strip_h + below_curves + curve_h + 0.2
    fig = plt.figure(figsize=(width, height))
    curve_bottom = height - 0.2 - curve_h
    curve_left, between = 0.8, 1.0  # room for the tick labels and "test accuracy"
    half = (width - curve_left - 0.15 - between) / 2
    for col, (key, label) in enumerate((("rotation", "rotation (degrees)"), ("translation", "translation (pixels)"))):
        ax = _axes_at(fig, width, height, curve_left + col * (half + between), curve_bottom, half, curve_h)
        xs = curves["rotation_degrees" if key == "rotation" else "translation_pixels"]
        for name, accuracy in curves["accuracy"].items():
            ax.plot(xs, accuracy[key], marker="o", label=name)
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    frame_bottom = 0.15 + key_h + (tile + 0.1) * has_recon
    for k in range(steps):
        x = left + k * column + (column - tile * views) / 2
        ax = _axes_at(fig, width, height, x, frame_bottom, tile * views, tile)
        _imshow(ax, frames[k])
        wrong = true is not None and strip["predicted"][k] != true
        ax.set_title(titles[k], fontsize=TITLE_POINTS, color=WRONG if wrong else "black")
        if k == 0:
            ax.set_ylabel("rotated", fontsize=8)
        if has_recon:
            ax = _axes_at(fig, width, height, x, 0.15 + key_h, tile * views, tile)
            _imshow(ax, strip["reconstructions"][k])
            if k == 0:
                ax.set_ylabel("recon.", fontsize=8)
    if true is not None:
        fig.text(left / width, 0.12 / height, f"true class: {class_names[true]}; above each frame the rotation, "
                 "the predicted class (red: wrong) and its capsule length |v|", fontsize=8)
    return fig


def draw_robustness(path, curves: dict, strip: dict, class_names) -> None:
    """The picture ``path``: accuracy against rotation and translation (one curve per model) above the
    rotated strip (frames, predicted class and length, reconstructions)."""
    save_figure(robustness_figure(curves, strip, class_names), path)


def write_rotation_gif(path, strip: dict, class_names, scale: int = 4) -> None:
    """Animated GIF of the strip: each frame the rotated input (and its reconstruction) with the
    predicted class written under it. Needs Pillow (the ``images`` extra)."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        raise UsageError("--gif needs Pillow: pip install 'tinygrad-caps[images]'") from None
    texts = [f"{strip['rotations'][k]:+d} deg: {class_names[strip['predicted'][k]]}" for k in range(len(strip["frames"]))]
    pictures = []
    for k, text in enumerate(texts):
        parts = [display_image(strip["frames"][k])]
        if strip["reconstructions"] is not None:
            parts.append(display_image(strip["reconstructions"][k]))
        row = np.concatenate(parts, axis=1)
        pixels = np.uint8(np.clip(row, 0, 1) * 255).repeat(scale, axis=0).repeat(scale, axis=1)
        image = Image.fromarray(pixels).convert("RGB")
        # Pillow's default font is about 6 pixels a character: every frame as wide as the longest text
        canvas = Image.new("RGB", (max(image.width, 6 * max(map(len, texts)) + 4), image.height + 14), "white")
        canvas.paste(image, (0, 0))
        ImageDraw.Draw(canvas).text((2, image.height + 1), text, fill="black")
        pictures.append(canvas)
    pictures[0].save(path, save_all=True, append_images=pictures[1:], duration=400, loop=0)
