"""``tinygrad-caps evaluate``: accuracy, per-class accuracy and confusion matrix of a checkpoint on a
test set, and with ``--reconstructions`` a picture of test images and their reconstructions."""
from __future__ import annotations

import json

import numpy as np

from ...analysis.pictures import require_libraries
from ...analysis.probes import write_reconstructions
from ...capsnet.config import MODEL_OPTIONS
from ...errors import UsageError
from ..training.checkpoints import checkpoint_dataset_spec, load_checkpoint_model
from ..training.output_paths import check_picture_path, picture_help
from ..training.run_folder import RunFolder
from ..training.progress import bars_wanted, progress_shown
from .model_options import add_model_options, positive_int

DEFAULT_NAME = object()  # evaluate --reconstructions without a file name: RUN/evaluate-reconstructions.png


HELP = "evaluate a checkpoint on a test set"


def add_arguments(parser) -> None:
    """The options of ``tinygrad-caps evaluate``."""
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--dataset", default=None, help="default: the dataset the checkpoint was trained on")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--batch-size", type=positive_int, default=100)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--limit-test", type=positive_int, default=None)
    parser.add_argument("--reconstructions", nargs="?", const=DEFAULT_NAME, default=None, metavar="FILE.png",
                        help="also draw 16 test images and their reconstructions (as visualize --what reconstructions) "
                             "and write the numbers drawn to FILE.json; "
                             + picture_help("RUN/evaluate-reconstructions.png, in the checkpoint's run folder"))
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (none is shown unless stderr is a terminal)")
    add_model_options(parser, defaults=False)


def run(args):
    """``evaluate``: accuracy, per-class accuracy and confusion matrix of a checkpoint; returns the exit status."""
    from ..training.trainer import evaluate, limited  # the training code only when the command runs

    out = None
    if args.reconstructions is not None:
        name = RunFolder.of_checkpoint(args.checkpoint) / "evaluate-reconstructions.png" if args.reconstructions is DEFAULT_NAME \
            else args.reconstructions
        out = check_picture_path(name, "--reconstructions", sidecars=(".json",))
        require_libraries()
    overrides = {k: v for k, v in vars(args).items() if k in MODEL_OPTIONS and v is not None}
    model, config = load_checkpoint_model(args.checkpoint, overrides, args.device)
    if out is not None and config.get("model") == "cnn":
        raise UsageError("--reconstructions needs a CapsNet checkpoint; the baseline CNN has no decoder")
    dataset = args.dataset or config["dataset"]
    data_dir = args.data_dir or config.get("data_dir")
    spec = checkpoint_dataset_spec(config, dataset, data_dir, args.checkpoint)
    images, labels = limited(*spec.load("test", data_dir), args.limit_test)
    num_classes = config["num_classes"]
    with progress_shown(len(labels), "evaluate", bars_wanted(args.no_progress)) as bar:
        result = evaluate(model, images, labels, args.batch_size, num_classes, progress=bar,
                          preprocess=spec.test_preprocess)
    names = list(spec.classes)
    confusion = result["confusion"]
    print(f"accuracy {result['accuracy']:.4f} on {int(confusion.sum())} {dataset} test images "
          f"(loss {result['loss']:.4f})")
    print("per-class accuracy:")
    for k in range(num_classes):
        total = confusion[k].sum()
        print(f"  {k} {names[k]:<12} {confusion[k, k] / max(total, 1):.4f} ({total} images)")
    print("confusion matrix (rows: true class, columns: predicted):")
    print(np.array2string(confusion, max_line_width=200))
    if out is not None:
        record = write_reconstructions(model, spec.preprocess(images[:16]), labels[:16], names, out)
        out.with_suffix(".json").write_text(json.dumps(dict(record, checkpoint=str(args.checkpoint), dataset=dataset)))
        print(f"written: {out}")
        print(f"written: {out.with_suffix('.json')}")
    return 0
