"""The ``tinygrad-caps`` command: ``train`` and ``evaluate`` CapsNet, ``visualize`` a checkpoint.

User errors (a bad option value, a missing, unreadable or corrupt dataset or checkpoint, a
checkpoint for another architecture, ``--device cuda`` without a GPU, an unusable ``--out``, a full
disk, a model too large for the machine) end with a one-line error and exit status 2. Anything else
is a bug: its traceback is printed with a line asking for a report (exit status 1). ``--debug``
prints tracebacks always. Ctrl-C and SIGTERM exit with 130 and 143 (``train`` saves first).
See ``cli_errors`` for the classification.
"""
from __future__ import annotations

import argparse
import datetime
import json
import signal
import sys
import traceback
from pathlib import Path

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.data import DATASETS

from .cli_errors import report
from .decoders import DECODERS
from .errors import UsageError
from .option_checks import check_out_folder, decay_factor, learning_rate, loss_weight, routing_iterations, seed
from .run_options import (CAPSULE_TRAINING_OPTIONS, NOT_RUN_OPTIONS, capsule_only_options, explicit_options,
                          resumed_options, saved_run_options)
from .output_paths import check_picture_path, picture_help, run_folder
from .progress import bars_wanted, progress_shown
from .run_state import Interrupted
from .routing import GRADIENT_MODES
from .capsnet import CONVENTIONS, parse_hidden_capsules
from .presets import PRESETS, preset_options
from .routing import ROUTING_KINDS
from .pictures import require_libraries
from .visualize import WHATS, visualize, write_reconstructions
from .training import (MODEL_OPTIONS, MODELS, checkpoint_dataset_spec, evaluate, limited, load_checkpoint_model, train,
                       use_command_device)


DEFAULT_NAME = object()  # evaluate --reconstructions without a file name: RUN/evaluate-reconstructions.png


def positive_int(text):
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def add_model_options(parser, defaults: bool):
    """Add the model's options to ``parser``; with ``defaults=False`` each defaults to None (evaluate
    and visualize then take the checkpoint's value)."""
    d = (lambda value: value) if defaults else (lambda value: None)
    parser.add_argument("--routing-iterations", type=routing_iterations, default=d(3))
    parser.add_argument("--routing-gradient", choices=GRADIENT_MODES, default=d("full"))
    parser.add_argument("--decoder", choices=DECODERS, default=d("fc"))
    parser.add_argument("--conv1-channels", type=positive_int, default=d(256))
    parser.add_argument("--primary-types", type=positive_int, default=d(32))
    parser.add_argument("--primary-dim", type=positive_int, default=d(8))
    parser.add_argument("--digit-dim", type=positive_int, default=d(16))
    parser.add_argument("--kernel-size", type=positive_int, default=d(9))
    parser.add_argument("--hidden-capsules", type=hidden_capsules, default=d([]), metavar="COUNTxDIM,...",
                        help="fully connected capsule layers between PrimaryCaps and DigitCaps, e.g. 32x12,32x12")
    parser.add_argument("--capsule-bias", action="store_true", default=d(False),
                        help="a learned bias per output capsule of every routing layer, added before the squash")
    parser.add_argument("--routing", choices=ROUTING_KINDS, default=d("dynamic"),
                        help="dynamic routing (Procedure 1) or uniform coupling c = 1/J")
    parser.add_argument("--conventions", choices=CONVENTIONS, default=d("paper"),
                        help="the paper's equations or the official code's biases, initialization and margin scaling")
    parser.add_argument("--leaky-routing", "--none-of-the-above", action="store_true", default=d(False),
                        help="an extra zero logit in the routing softmax (\"none of the above\")")


def hidden_capsules(text):
    """argparse type: "32x12,32x12" -> [(32, 12), (32, 12)]."""
    try:
        return parse_hidden_capsules(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2), like every other user error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def make_parser():
    """The ``tinygrad-caps`` argument parser with its subcommands."""
    parser = OneLineErrorParser(prog="tinygrad-caps", description="Train and evaluate CapsNet on tinygrad-caps.")
    parser.add_argument("--debug", action="store_true", help="print the traceback of every error")
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a CapsNet or the paper's baseline CNN (--model cnn)")
    t.add_argument("--model", choices=MODELS, default="capsnet", help="CapsNet or the paper's baseline CNN")
    t.add_argument("--preset", choices=tuple(PRESETS), default=None,
                   help="sabour-official: the official code's conventions and training options; cifar10: Sabour et "
                        "al.'s CIFAR-10 changes (64 primary capsule types, none-of-the-above); explicit options win")
    t.add_argument("--dataset", default="fashion-mnist",
                   help=f"{', '.join(DATASETS)}, or the name of a folder of IDX files under --data-dir")
    t.add_argument("--data-dir", default=None, help="where the dataset's files are (imagefolder: PATH with train/, test/)")
    t.add_argument("--image-size", type=positive_int, default=None, help="imagefolder: resize to N x N (default 32)")
    t.add_argument("--channels", type=int, choices=(1, 3), default=None, help="imagefolder: 1 (gray) or 3 (RGB, default)")
    t.add_argument("--epochs", type=positive_int, default=30)
    t.add_argument("--batch-size", type=positive_int, default=100)
    t.add_argument("--lr", type=learning_rate, default=1e-3, help="Adam's learning rate, in (0, 1]")
    t.add_argument("--lr-decay", type=decay_factor, default=0.9,
                   help="ExponentialLR gamma in (0, 1], applied after each epoch")
    t.add_argument("--reconstruction-weight", type=loss_weight, default=0.0005, help="in [0, 1000]")
    add_model_options(t, defaults=True)
    t.add_argument("--augment", choices=["default", "none", "shift", "shift+flip"], default="default",
                   help="default: the dataset's (shift for MNIST-like data and image folders; none for smallnorb and "
                        "cifar10, whose random crops are their augmentation)")
    t.add_argument("--device", default="auto", help="auto, cpu or cuda")
    t.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    t.add_argument("--seed", type=seed, default=0)
    t.add_argument("--out", default=None, help="run folder (default: a new folder under runs/)")
    t.add_argument("--limit-train", type=positive_int, default=None)
    t.add_argument("--limit-test", type=positive_int, default=None)
    t.add_argument("--resume", action="store_true", help="continue the run in --out from checkpoints/last.npz")
    t.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    t.add_argument("--profile", type=positive_int, default=None, metavar="N",
                   help="profile N training batches, print the time per op and exit (writes nothing)")
    t.add_argument("--log-gradflow", type=positive_int, default=None, metavar="N",
                   help="every N batches, append that batch's routing statistics and per-iteration gradient norms "
                        "to RUN/gradflow.jsonl")
    t.add_argument("--distributed", action="store_true",
                   help="data-parallel training over the processes that mpirun started (--batch-size is the global "
                        "batch; rank 0 writes the files)")
    t.add_argument("--sync-batchnorm", action="store_true",
                   help="with --distributed: batch-norm statistics over the global batch (default: per process)")

    e = sub.add_parser("evaluate", help="evaluate a checkpoint on a test set")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--dataset", default=None, help="default: the dataset the checkpoint was trained on")
    e.add_argument("--data-dir", default=None)
    e.add_argument("--batch-size", type=positive_int, default=100)
    e.add_argument("--device", default="auto")
    e.add_argument("--limit-test", type=positive_int, default=None)
    e.add_argument("--reconstructions", nargs="?", const=DEFAULT_NAME, default=None, metavar="FILE.png",
                   help="also draw 16 test images and their reconstructions (as visualize --what reconstructions) "
                        "and write the numbers drawn to FILE.json; "
                        + picture_help("RUN/evaluate-reconstructions.png, in the checkpoint's run folder"))
    e.add_argument("--no-progress", action="store_true", help="no progress bar (none is shown unless stderr is a terminal)")
    add_model_options(e, defaults=False)

    v = sub.add_parser("visualize", help="reconstructions, pose perturbation or robustness pictures of a checkpoint")
    v.add_argument("--checkpoint", required=True)
    v.add_argument("--what", required=True, choices=WHATS)
    v.add_argument("--out", default=None, metavar="FILE.png",
                   help="the numbers drawn go to FILE.json (and --gif to FILE.gif); "
                        + picture_help("RUN/visualize-WHAT.png, in the checkpoint's run folder"))
    v.add_argument("--dataset", default=None, help="default: the dataset the checkpoint was trained on")
    v.add_argument("--data-dir", default=None)
    v.add_argument("--count", type=positive_int, default=None,
                   help="test images: reconstructions 16, perturbation 3, robustness 500 by default")
    v.add_argument("--compare", default=None, metavar="CKPT2", help="robustness: a second checkpoint's curves")
    v.add_argument("--gif", action="store_true", help="robustness: also FILE.gif, the rotated image animated")
    v.add_argument("--device", default="auto")
    v.add_argument("--no-progress", action="store_true", help="no progress bar (none is shown unless stderr is a terminal)")

    g = sub.add_parser("gradflow", help="how the gradient flows through routing, per mode, iteration and path")
    g.add_argument("--checkpoint", default=None, help="default: a freshly initialised model (the model options apply)")
    g.add_argument("--dataset", default=None, help="default: the checkpoint's, else fashion-mnist")
    g.add_argument("--data-dir", default=None)
    g.add_argument("--batch-size", type=positive_int, default=32)
    g.add_argument("--batches", type=positive_int, default=4, help="training batches; the figures are their means")
    g.add_argument("--modes", default="full,detach", help="routing-gradient modes to compare, comma-separated")
    g.add_argument("--hessian-iterations", type=int, default=0,
                   help="power iterations for the top Hessian eigenvalue of the loss in digit.weight (0: none)")
    g.add_argument("--device", default="auto")
    g.add_argument("--seed", type=seed, default=0, help="which batches, and a fresh model's initialisation")
    g.add_argument("--out", default=None, metavar="DIR",
                   help="a folder: writes DIR/gradflow.json and DIR/gradflow.png (default: a new folder under runs/)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar (none is shown unless stderr is a terminal)")
    add_model_options(g, defaults=False)

    p = sub.add_parser("plot", help="loss, accuracy and gradient-flow curves of a training run")
    p.add_argument("run", metavar="RUN", help="a run folder (with metrics.jsonl, and gradflow.jsonl if logged)")
    p.add_argument("--out", default=None, metavar="FILE.png", help=picture_help("RUN/plot.png"))
    for command in sub.choices.values():  # --debug before or after the command
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="print the traceback of every error")
    return parser


def run_train(args):
    """``train``: build the run's config from ``args`` and train; returns the exit status."""
    config = {k: v for k, v in vars(args).items() if k not in NOT_RUN_OPTIONS}
    if config["augment"] == "none":
        config["augment"] = None
    explicit = getattr(args, "explicit", set())
    if args.resume and not args.out:
        raise UsageError("--resume needs --out, the run folder to continue")
    out = Path(args.out) if args.out else Path("runs") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    if args.resume and not args.profile:
        saved = saved_run_options(out)
        if saved is not None:  # the run goes on as it was configured
            first_rank = (tc.distributed.launcher_rank() or 0) == 0  # one report, not one per mpirun rank
            config = resumed_options(config, explicit, saved, log=None if first_rank else lambda text: None)
    if config["model"] == "cnn":
        config = cnn_options(config, explicit)
    if args.profile:
        from . import profile_command

        return profile_command.run(config, args.profile)
    check_out_folder(out, args.resume)
    if out.exists() and not args.resume and (out / "metrics.jsonl").exists():
        raise UsageError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    # the Trainer prints "run folder: ..." once it has created it, after the first batch
    if args.distributed:
        from .distributed_training import abort_on_error, train_distributed

        with abort_on_error("train", args.debug):
            train_distributed(config, out, resume=args.resume, show_progress=not args.no_progress,
                              sync_batchnorm=args.sync_batchnorm)
        return 0
    if args.sync_batchnorm:
        raise UsageError("--sync-batchnorm needs --distributed")
    started = tc.distributed.launcher_world_size()
    if started and started > 1:  # several independent runs would write into one --out
        raise UsageError(f"mpirun started {started} processes: add --distributed to train one model on all of them")
    train(config, out, resume=args.resume, show_progress=not args.no_progress)
    return 0


def cnn_options(config: dict, explicit: set) -> dict:
    """``config`` for ``--model cnn``: CapsNet-only options given explicitly are refused (UsageError),
    and the CapsNet's defaults are left out, so ``config.json`` records only what the CNN uses."""
    given = capsule_only_options(explicit, MODEL_OPTIONS)
    if given:
        raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to CapsNet only, "
                         "not to --model cnn (the baseline CNN has no capsules, routing or decoder)")
    return {k: v for k, v in config.items() if k not in MODEL_OPTIONS and k not in CAPSULE_TRAINING_OPTIONS}


def run_evaluate(args):
    """``evaluate``: accuracy, per-class accuracy and confusion matrix of a checkpoint; returns the exit status."""
    out = None
    if args.reconstructions is not None:
        name = run_folder(args.checkpoint) / "evaluate-reconstructions.png" if args.reconstructions is DEFAULT_NAME \
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


def run_visualize(args):
    """``visualize``: draw what ``--what`` names for a checkpoint; returns the exit status."""
    visualize(args.checkpoint, args.what, args.out, dataset=args.dataset, data_dir=args.data_dir, count=args.count,
              compare=args.compare, gif=args.gif, device=args.device, progress=bars_wanted(args.no_progress))
    return 0


def parse_with_preset(parser, argv):
    """Parse ``argv``; with ``train --preset NAME`` the preset's options become the defaults, so
    options given on the command line still win."""
    args = parser.parse_args(argv)
    if getattr(args, "preset", None):
        train_parser = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices["train"]
        train_parser.set_defaults(**preset_options(args.preset, args.dataset))
        args = parser.parse_args(argv)
    return args


def main(argv=None) -> int:
    """Run one command with ``argv`` (default: the command line); returns the exit status (0, 1 for
    a bug, 2 for a user error, 128 + signal when stopped)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_with_preset(make_parser(), argv)
    if args.command == "train":
        args.explicit = explicit_options(make_parser(), argv)
    tc.tune_allocator()  # process-wide malloc tuning for large temporaries (TINYGRAD_CAPS_MALLOC_TUNING=0: off)
    try:
        if getattr(args, "device", None) is not None and not getattr(args, "distributed", False):
            use_command_device(args.device)  # (each rank of a distributed run takes its own GPU)
        if args.command == "visualize":
            return run_visualize(args)
        if args.command == "gradflow":
            from . import gradflow_command

            return gradflow_command.run(args)
        if args.command == "plot":
            from .plots import plot_run

            print(f"written: {plot_run(args.run, args.out)}")
            return 0
        return run_train(args) if args.command == "train" else run_evaluate(args)
    except KeyboardInterrupt as exc:  # train has saved its checkpoint already
        if args.debug:
            traceback.print_exc()
        return 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)
    except BrokenPipeError:  # whoever read stdout has gone: nothing is left to say
        return 128 + signal.SIGPIPE
    except Exception as exc:  # noqa: BLE001  (user errors are one line, bugs keep their traceback)
        return report(exc, args.command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
