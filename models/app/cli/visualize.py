"""``tinygrad-caps visualize``: what a trained CapsNet learned, as pictures of a checkpoint:
reconstructions, the pose-perturbation grid of Sabour et al. (2017) Fig. 4, and robustness to
rotation and translation (with a second model's curve and a rotated strip, optionally an animated
GIF). Each picture comes with a JSON file of the numbers drawn. The model passes and the drawing are
``analysis.probes`` and ``analysis.pictures``; here the checkpoints are loaded and the files checked.
"""
from __future__ import annotations

import json
from pathlib import Path

from ...analysis.pictures import TWEAKS, draw_perturbation, draw_robustness, require_libraries, write_rotation_gif
from ...analysis.probes import (ROTATIONS, TRANSLATIONS, perturbation_grids, require_capsnet, robustness_curves,
                                rotation_strip, rounded, write_reconstructions)
from ...errors import UsageError
from ..training.checkpoints import checkpoint_dataset_spec, load_checkpoint_model
from ..training.output_paths import check_picture_path, picture_help, run_name
from ..training.run_folder import RunFolder
from ..training.progress import bars_wanted, progress_shown

from .model_options import positive_int

WHATS = ("reconstructions", "perturbation", "robustness")
DEFAULT_COUNTS = {"reconstructions": 16, "perturbation": 3, "robustness": 500}


def default_picture(checkpoint, what: str) -> Path:
    """Where ``visualize`` draws ``what`` without --out: RUN/visualize-WHAT.png in the checkpoint's run
    folder (``evaluate --reconstructions`` without a name writes RUN/evaluate-reconstructions.png)."""
    return RunFolder.of_checkpoint(checkpoint) / f"visualize-{what}.png"


def model_label(checkpoint, config: dict, taken=()) -> str:
    """A model's name in the robustness legend: its run folder's name and kind, e.g. "quick (capsnet)";
    the checkpoint's file name is added where that name is already ``taken``."""
    label = f"{run_name(checkpoint)} ({config.get('model') or 'capsnet'})"
    if label in taken:
        label = f"{run_name(checkpoint)} ({config.get('model') or 'capsnet'}, {Path(checkpoint).name})"
    return label if label not in taken else f"{label} [compare]"


def visualize(checkpoint, what: str, out, dataset=None, data_dir=None, count=None, compare=None, gif: bool = False,
              device: str = "auto", log=print, progress: bool = False) -> dict:
    """Draw ``what`` ("reconstructions", "perturbation" or "robustness") for ``checkpoint`` into the
    picture ``out`` (.png, .pdf or .svg; None: ``default_picture``) and write the numbers drawn to
    ``out`` with the suffix ``.json``; ``log`` is told every file written.

    The test images are the first ``count`` of ``dataset`` (default: the checkpoint's), preprocessed
    as the registry says; ``compare`` adds a second checkpoint's robustness curves; ``gif`` also
    writes the rotated strip as ``out`` with the suffix ``.gif``; ``progress`` shows a bar over the
    model passes. Every option is checked before any work. Returns the JSON's content.
    """
    if what not in WHATS:
        raise UsageError(f"visualize: --what must be one of {WHATS}, got {what!r}")
    if count is not None and count < 1:
        raise UsageError(f"visualize: --count must be positive, got {count}")
    if gif and what != "robustness":
        raise UsageError("visualize: --gif goes with --what robustness")
    if compare and what != "robustness":
        raise UsageError("visualize: --compare goes with --what robustness")
    for path in (checkpoint, compare):
        if path is not None and not Path(path).is_file():
            raise UsageError(f"{path}: no such checkpoint")
    out = check_picture_path(default_picture(checkpoint, what) if out is None else out, "--out",
                             sidecars=(".json", ".gif") if gif else (".json",))
    require_libraries(gif)
    count = count or DEFAULT_COUNTS[what]
    model, config = load_checkpoint_model(checkpoint, device=device)
    if what != "robustness":
        require_capsnet(model, f"--what {what}")
    name = dataset or config["dataset"]
    data_dir = data_dir or config.get("data_dir")
    spec = checkpoint_dataset_spec(config, name, data_dir, checkpoint)
    models = {model_label(checkpoint, config): model}
    if compare:
        other, other_config = load_checkpoint_model(compare, device=device)
        spec.check_model(other_config["in_channels"], other_config["image_size"], other_config["num_classes"],
                         f"--compare checkpoint {compare}")
        models[model_label(compare, other_config, taken=models)] = other
    from ..training.trainer import limited  # the training code only when a command runs

    images, labels = limited(*spec.load("test", data_dir), count)
    x = spec.preprocess(images)
    classes = list(spec.classes)
    record = {"what": what, "checkpoint": str(checkpoint), "dataset": name, "classes": classes,
              "count": int(len(x)), "labels": labels.tolist()}
    written = [out]
    if what == "reconstructions":
        with progress_shown(len(x), "reconstructions", progress) as bar:
            record.update(write_reconstructions(model, x, labels, classes, out, progress=bar))
    elif what == "perturbation":
        with progress_shown(len(x), "perturbation", progress) as bar:
            grids, predicted = perturbation_grids(model, x, progress=bar)
        draw_perturbation(out, grids, predicted, classes)
        record.update(predicted=predicted.tolist(), tweaks=TWEAKS.tolist(),
                      grid_shape=["image", "dimension", "tweak", "channel", "row", "column"],
                      grids=rounded(grids))
    else:
        passes = (len(ROTATIONS) + len(TRANSLATIONS)) * len(models) * len(labels)
        with progress_shown(passes, "robustness", progress) as bar:
            curves = robustness_curves(models, images, labels, spec.test_preprocess, progress=bar)
        strip = rotation_strip(model, images[0], spec.test_preprocess)
        strip.update(rotations=[int(r) for r in ROTATIONS], label=int(labels[0]))
        draw_robustness(out, curves, strip, classes)
        record.update(curves, strip={"label": int(labels[0]), "rotation_degrees": strip["rotations"],
                                     "predicted": strip["predicted"].tolist(),
                                     "lengths": None if strip["lengths"] is None else rounded(strip["lengths"]),
                                     "frames": rounded(strip["frames"]),
                                     "reconstructions": None if strip["reconstructions"] is None
                                     else rounded(strip["reconstructions"])})
        if gif:
            write_rotation_gif(out.with_suffix(".gif"), strip, classes)
            record["gif"] = str(out.with_suffix(".gif"))
            written.append(out.with_suffix(".gif"))
    out.with_suffix(".json").write_text(json.dumps(record))
    for path in written + [out.with_suffix(".json")]:
        log(f"written: {path}")
    return record


HELP = "reconstructions, pose perturbation or robustness pictures of a checkpoint"


def add_arguments(parser) -> None:
    """The options of ``tinygrad-caps visualize``."""
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--what", required=True, choices=WHATS)
    parser.add_argument("--out", default=None, metavar="FILE.png",
                        help="the numbers drawn go to FILE.json (and --gif to FILE.gif); "
                             + picture_help("RUN/visualize-WHAT.png, in the checkpoint's run folder"))
    parser.add_argument("--dataset", default=None, help="default: the dataset the checkpoint was trained on")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--count", type=positive_int, default=None,
                        help="test images: reconstructions 16, perturbation 3, robustness 500 by default")
    parser.add_argument("--compare", default=None, metavar="CKPT2", help="robustness: a second checkpoint's curves")
    parser.add_argument("--gif", action="store_true", help="robustness: also FILE.gif, the rotated image animated")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (none is shown unless stderr is a terminal)")


def run(args) -> int:
    """Run the command for parsed ``args``; returns the exit status."""
    visualize(args.checkpoint, args.what, args.out, dataset=args.dataset, data_dir=args.data_dir, count=args.count,
              compare=args.compare, gif=args.gif, device=args.device, progress=bars_wanted(args.no_progress))
    return 0
