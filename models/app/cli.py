"""The ``tinygrad-caps`` command's options, and the dispatch to one module per command under
``commands/`` (train, evaluate, visualize, gradflow, plot, study; ``train --profile`` is ``commands.profile``).
A user error is one line and exit status 2, a bug its traceback and status 1 (``cli_errors``).
"""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import traceback

import tinygrad_caps as tc
from tinygrad_caps.cuda_graphs import MODES as CUDA_GRAPH_MODES
from tinygrad_caps.data import DATASETS
from tinygrad_caps.kernels.gemm import PRECISIONS

from ..capsnet.losses import DEFAULT_RECONSTRUCTION_WEIGHT
from .checkpoints import MODELS
from .cli_errors import report
from .commands.evaluate import DEFAULT_NAME
from .commands.visualize import WHATS
from .model_options import add_cnn_options, add_model_options, positive_int
from .option_checks import decay_factor, learning_rate, loss_weight, positive_float, seed, use_command_device
from .output_paths import picture_help
from .presets import PRESETS, preset_options
from .run_options import explicit_options
from .run_state import Interrupted


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2), like every other user error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but an unrecognized option is refused by the (sub)command it was given to,
        with the nearest option that command has (``--epcohs``: did you mean --epochs?)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = _innermost_command(self, parsed)
            command.error(f"unrecognized arguments: {' '.join(extras)}{_nearest_options(command, extras)}")
        return parsed


def _innermost_command(parser, parsed):
    """The (sub)parser of the command ``parsed`` chose: ``tinygrad-caps study run``'s for ``study run``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(parsed, action.dest, None) in action.choices:
            return _innermost_command(action.choices[getattr(parsed, action.dest)], parsed)
    return parser


def _nearest_options(parser, extras) -> str:
    """``"; did you mean --epochs?"`` for the options in ``extras`` that are near one of ``parser``'s."""
    import difflib

    known = [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]
    guesses = []
    for extra in extras:
        if extra.startswith("--"):
            guesses += difflib.get_close_matches(extra.split("=", 1)[0], known, n=1, cutoff=0.7)
    return f"; did you mean {' or '.join(dict.fromkeys(guesses))}?" if guesses else ""


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
    add_training_options(t)
    t.add_argument("--seed", type=seed, default=0)
    t.add_argument("--out", default=None, help="run folder (default: a new folder under runs/)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from checkpoints/last.npz")
    t.add_argument("--profile", type=positive_int, default=None, metavar="N",
                   help="profile N training batches, print the time per op and exit (writes nothing)")
    t.add_argument("--tensorboard", nargs="?", const="", default=None, metavar="DIR",
                   help="also write TensorBoard event files (default folder RUN/tensorboard; needs tensorboardX: "
                        "pip install -e '.[tensorboard]'): losses, accuracy, rate and images/s per logging interval, "
                        "each epoch's metrics and reconstructions, and with --log-gradflow the routing figures and "
                        "histograms of the couplings and gradients")
    t.add_argument("--distributed", action="store_true",
                   help="data-parallel training over the processes that mpirun started (--batch-size is the global "
                        "batch; rank 0 writes the files)")
    t.add_argument("--sync-batchnorm", action="store_true",
                   help="with --distributed: batch-norm statistics over the global batch (default: per process)")

    add_study_parser(sub)

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
    g.add_argument("--modes", default=None, help="routing-gradient modes to compare, comma-separated (default: "
                                                 "full,detach, or full alone where the routing is not iterative)")
    g.add_argument("--hessian-iterations", type=int, default=0,
                   help="power iterations for the top Hessian eigenvalue of the loss in digit.weight (0: none)")
    g.add_argument("--device", default="auto")
    g.add_argument("--seed", type=seed, default=0, help="which batches, and a fresh model's initialisation")
    g.add_argument("--out", default=None, metavar="DIR",
                   help="a folder: writes DIR/gradflow.json and DIR/gradflow.png (default: a new folder under runs/)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar (none is shown unless stderr is a terminal)")
    add_model_options(g, defaults=False)

    d = sub.add_parser("graph", help="draw the graph one training batch records (routing iterations boxed)")
    d.add_argument("--checkpoint", default=None, help="default: a freshly initialised model (the model options apply)")
    d.add_argument("--out", required=True, metavar="FILE.svg",
                   help="the drawing: .svg, .png or .pdf (with Graphviz's dot), or .dot (the text itself)")
    d.add_argument("--backward", action="store_true",
                   help="also draw the graph of the gradients (a create_graph=True backward: grad-of-grad)")
    d.add_argument("--batch-size", type=positive_int, default=1)
    d.add_argument("--seed", type=seed, default=0, help="the batch, and a fresh model's initialisation")
    d.add_argument("--device", default="auto")
    add_model_options(d, defaults=False)

    p = sub.add_parser("plot", help="loss, accuracy and gradient-flow curves of a training run")
    p.add_argument("run", metavar="RUN", help="a run folder (with metrics.jsonl, and gradflow.jsonl if logged)")
    p.add_argument("--out", default=None, metavar="FILE.png", help=picture_help("RUN/plot.png"))
    p.add_argument("--tensorboard-out", default=None, metavar="DIR",
                   help="also export the run's metrics.jsonl and gradflow.jsonl as TensorBoard event files in DIR")
    for command in sub.choices.values():  # --debug before or after the command
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="print the traceback of every error")
    return parser


def add_training_options(t) -> None:
    """What ``train`` and ``study run`` share: the data, the training budget and schedule, the model
    options (CapsNet's and the CNN's), the device and the logs."""
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
    t.add_argument("--reconstruction-weight", type=loss_weight, default=DEFAULT_RECONSTRUCTION_WEIGHT,
                   help="in [0, 1000]")
    add_model_options(t, defaults=True)
    add_cnn_options(t)
    t.add_argument("--augment", choices=["default", "none", "shift", "shift+flip"], default="default",
                   help="default: the dataset's (shift for MNIST-like data and image folders; none for smallnorb and "
                        "cifar10, whose random crops are their augmentation)")
    t.add_argument("--device", default="auto", help="auto, cpu or cuda")
    t.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    t.add_argument("--cuda-graph", choices=CUDA_GRAPH_MODES, default="auto",
                   help="capture the training step as a CUDA graph and replay it (GPU only; auto: where the step "
                        "allows it, saying why not otherwise; on: fail where it cannot; the last, smaller batch "
                        "of an epoch and logged gradflow steps run eagerly)")
    t.add_argument("--matmul-precision", choices=PRECISIONS, default="highest",
                   help="GPU matrix products and convolutions in float32 (highest) or TF32 tensor cores (high, "
                        "PyTorch's default for cuDNN convolutions); the CPU always computes in float32")
    t.add_argument("--limit-train", type=positive_int, default=None)
    t.add_argument("--limit-test", type=positive_int, default=None)
    t.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    t.add_argument("--log-gradflow", type=positive_int, default=None, metavar="N",
                   help="every N batches, append that batch's routing statistics and per-iteration gradient norms "
                        "to RUN/gradflow.jsonl")
    t.add_argument("--log-mode-cosine", action="store_true",
                   help="with --log-gradflow: also the cosine between the logged step's gradient and the other "
                        "routing-gradient mode's (full or detach) on the same batch and weights (one more forward "
                        "and backward per logged step; one process only)")


def add_study_parser(sub) -> None:
    """``study list``, ``study run NAME`` (with the training options) and ``study summary DIR``."""
    s = sub.add_parser("study", help="run a registered study over configurations and seeds, with a summary")
    actions = s.add_subparsers(dest="study_command", required=True)
    actions.add_parser("list", help="one line per registered study: name, what it varies, default budget")
    r = actions.add_parser("run", help="train every configuration of a study with every seed, then summarise")
    r.add_argument("name", metavar="NAME", help="a registered study (see study list)")
    r.add_argument("--out", required=True, metavar="DIR",
                   help="the study's folder: DIR/runs/CONFIG/seed-S/ (run folders), DIR/study.json, DIR/summary.*")
    r.add_argument("--seeds", type=positive_int, default=None, metavar="N", help="seeds 0..N-1 (default: the study's)")
    r.add_argument("--seed-list", default=None, metavar="S,S,...", help="these seeds instead of 0..N-1")
    r.add_argument("--max-minutes", type=positive_float, default=None, metavar="M",
                   help="stop at the first batch boundary after M minutes, save, and say how to continue (exit 75)")
    r.add_argument("--resume", action="store_true",
                   help="continue the study in --out: finished runs are skipped, interrupted ones continue exactly")
    r.add_argument("--max-depth", type=positive_int, default=None, metavar="K",
                   help="depth: 0 to K hidden capsule layers (default 3)")
    r.add_argument("--tensorboard-out", default=None, metavar="TB",
                   help="also export every run's logs as TensorBoard event files: TB/CONFIG/seed-S/")
    add_training_options(r)
    r.set_defaults(epochs=None)
    next(action for action in r._actions if action.dest == "epochs").help = "epochs of every run (default: the study's)"
    m = actions.add_parser("summary", help="write DIR/summary.json, .md and .png from a study's finished runs")
    m.add_argument("out", metavar="DIR", help="a study folder (with study.json)")
    m.add_argument("--tensorboard-out", default=None, metavar="TB",
                   help="also export every run's logs as TensorBoard event files: TB/CONFIG/seed-S/")


def parse_with_preset(parser, argv):
    """Parse ``argv``; with ``train --preset NAME`` the preset's options become the defaults, so
    options given on the command line still win."""
    args = parser.parse_args(argv)
    if getattr(args, "preset", None):
        train_parser = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices["train"]
        train_parser.set_defaults(**preset_options(args.preset, args.dataset))
        args = parser.parse_args(argv)
    return args


def resolve_checkpoint_folders(args) -> None:
    """``--checkpoint RUN`` (and visualize's ``--compare RUN``) given a run folder take its
    checkpoints/best.npz, as ``plot`` takes run folders; the file used is printed."""
    from .checkpoints import checkpoint_of

    for dest in ("checkpoint", "compare"):
        given = getattr(args, dest, None)
        if given is None:
            continue
        chosen = checkpoint_of(given, f"--{dest}")
        if str(chosen) != str(given):
            print(f"{args.command}: --{dest} {given} is a run folder: using {chosen}")
            setattr(args, dest, str(chosen))


def main(argv=None) -> int:
    """Run one command with ``argv`` (default: the command line); returns the exit status (0, 1 for
    a bug, 2 for a user error, 128 + signal when stopped)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_with_preset(make_parser(), argv)
    if args.command in ("train", "study"):
        args.explicit = explicit_options(make_parser(), argv)
        args.command_line = argv
    tc.tune_allocator()  # process-wide malloc tuning for large temporaries (TINYGRAD_CAPS_MALLOC_TUNING=0: off)
    try:
        resolve_checkpoint_folders(args)
        if getattr(args, "device", None) is not None and not getattr(args, "distributed", False):
            use_command_device(args.device)  # (each rank of a distributed run takes its own GPU)
        # commands/NAME.py runs command NAME; each is imported only when it runs
        return importlib.import_module(f"{__package__}.commands.{args.command}").run(args)
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
