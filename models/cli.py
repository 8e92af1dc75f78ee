"""The ``tinygrad-caps`` command: ``train`` and ``evaluate`` CapsNet.

Bad input (a missing or corrupt dataset, a checkpoint for another architecture, ``--device cuda``
without a GPU, a non-positive batch size) ends with a one-line error and exit status 2.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.datasets import KNOWN, DatasetError, load_dataset

from .decoders import DECODERS
from .routing import GRADIENT_MODES
from .training import MODEL_OPTIONS, evaluate, limited, load_checkpoint_model, save_reconstructions, train


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def add_model_options(parser, defaults: bool):
    d = (lambda value: value) if defaults else (lambda value: None)
    parser.add_argument("--routing-iterations", type=positive_int, default=d(3))
    parser.add_argument("--routing-gradient", choices=GRADIENT_MODES, default=d("full"))
    parser.add_argument("--decoder", choices=DECODERS, default=d("fc"))
    parser.add_argument("--conv1-channels", type=positive_int, default=d(256))
    parser.add_argument("--primary-types", type=positive_int, default=d(32))
    parser.add_argument("--primary-dim", type=positive_int, default=d(8))
    parser.add_argument("--digit-dim", type=positive_int, default=d(16))
    parser.add_argument("--kernel-size", type=positive_int, default=d(9))


def make_parser():
    parser = argparse.ArgumentParser(prog="tinygrad-caps", description="Train and evaluate CapsNet on tinygrad-caps.")
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a CapsNet")
    t.add_argument("--dataset", default="fashion-mnist", help=f"{', '.join(KNOWN)}, or any folder name under --data-dir")
    t.add_argument("--data-dir", default=None)
    t.add_argument("--epochs", type=positive_int, default=30)
    t.add_argument("--batch-size", type=positive_int, default=100)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--lr-decay", type=float, default=0.9, help="ExponentialLR gamma, applied after each epoch")
    t.add_argument("--reconstruction-weight", type=float, default=0.0005)
    add_model_options(t, defaults=True)
    t.add_argument("--augment", choices=["none", "shift", "shift+flip"], default="shift")
    t.add_argument("--device", default="auto", help="auto, cpu or cuda")
    t.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", default=None, help="run folder (default: a new folder under runs/)")
    t.add_argument("--limit-train", type=positive_int, default=None)
    t.add_argument("--limit-test", type=positive_int, default=None)
    t.add_argument("--resume", action="store_true", help="continue the run in --out from checkpoints/last.npz")
    t.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")

    e = sub.add_parser("evaluate", help="evaluate a checkpoint on a test set")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--dataset", default=None, help="default: the dataset the checkpoint was trained on")
    e.add_argument("--data-dir", default=None)
    e.add_argument("--batch-size", type=positive_int, default=100)
    e.add_argument("--device", default="auto")
    e.add_argument("--limit-test", type=positive_int, default=None)
    e.add_argument("--reconstructions", default=None, metavar="FILE.png")
    add_model_options(e, defaults=False)
    return parser


def run_train(args):
    config = {k: v for k, v in vars(args).items() if k not in ("command", "out", "resume", "no_progress")}
    if config["augment"] == "none":
        config["augment"] = None
    if args.resume and not args.out:
        raise ValueError("--resume needs --out, the run folder to continue")
    out = Path(args.out) if args.out else Path("runs") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    if out.exists() and not args.resume and (out / "metrics.jsonl").exists():
        raise ValueError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    print(f"run folder: {out}")
    train(config, out, resume=args.resume, show_progress=not args.no_progress)
    return 0


def run_evaluate(args):
    overrides = {k: v for k, v in vars(args).items() if k in MODEL_OPTIONS and v is not None}
    model, config = load_checkpoint_model(args.checkpoint, overrides, args.device)
    dataset = args.dataset or config["dataset"]
    images, labels = limited(*load_dataset(dataset, "test", args.data_dir or config.get("data_dir")), args.limit_test)
    num_classes = config["num_classes"]
    result = evaluate(model, images, labels, args.batch_size, num_classes)
    names = KNOWN.get(dataset, {}).get("classes") or [str(k) for k in range(num_classes)]
    confusion = result["confusion"]
    print(f"accuracy {result['accuracy']:.4f} on {int(confusion.sum())} {dataset} test images "
          f"(loss {result['loss']:.4f})")
    print("per-class accuracy:")
    for k in range(num_classes):
        total = confusion[k].sum()
        print(f"  {k} {names[k]:<12} {confusion[k, k] / max(total, 1):.4f} ({total} images)")
    print("confusion matrix (rows: true class, columns: predicted):")
    print(np.array2string(confusion, max_line_width=200))
    if args.reconstructions:
        x = images[:16].astype(np.float32) / 255.0
        with tc.no_grad():
            _, _, recon = model(tc.tensor(x, device=model.device))
        save_reconstructions(args.reconstructions, x, recon.numpy())
        print(f"reconstructions written to {args.reconstructions}")
    return 0


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return run_train(args) if args.command == "train" else run_evaluate(args)
    except KeyboardInterrupt:
        return 130
    except (DatasetError, tc.DeviceError, tc.CheckpointError, tc.StateDictError, FileNotFoundError, ValueError,
            RuntimeError) as exc:
        print(f"tinygrad-caps {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
