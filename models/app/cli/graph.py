"""``tinygrad-caps graph``: a drawing of the graph that one training batch records for a CapsNet (a
checkpoint's, or a freshly initialised one from the model options), the routing iterations in
boxes of their own, and with ``--backward`` the graph of the gradients too (grad-of-grad).

By default one routing iteration is drawn op by op (iteration 2, the first with every step of an
iterative routing, or the only one) and the others folded into one node each, as is the backward of
every other op (``--expand all`` draws every op, ``--expand N`` iteration N, ``--expand none`` folds
them all)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

import tinygrad_caps as tc

from ...capsnet.baseline_cnn import BaselineCNN
from ...capsnet.config import MODEL_OPTIONS
from ...errors import UsageError
from ..training.checkpoints import build_model, load_checkpoint_model
from ..training.option_checks import device_or_usage_error, seed
from ..training.output_paths import SUFFIX_TEXT, check_picture_path, check_writable_file
from .model_options import add_model_options, positive_int

GEOMETRY = dict(in_channels=1, image_size=28, num_classes=10)  # a fresh model's, as on MNIST-like data


def check_graph_path(out) -> Path:
    """``--out``: a picture (.png, .pdf, .svg: drawn with Graphviz) or a .dot file (the text itself);
    a folder (an existing one, or a name ending in a slash) is refused."""
    text = str(out)
    if text.strip() and (text.endswith(("/", os.sep)) or os.path.isdir(text)):
        raise UsageError(f"--out {text} is a folder; name a {SUFFIX_TEXT} file (or a .dot file for the Graphviz text)")
    path = Path(text)
    if path.suffix.lower() == ".dot":
        return check_writable_file(path, "--out")
    try:
        return check_picture_path(text, "--out")
    except UsageError as exc:
        raise UsageError(f"{exc} (or a .dot file for the Graphviz text)") from None


def check_dot_can_draw(out: Path) -> None:
    """Raise UsageError unless Graphviz's dot is installed and offers ``out``'s format (checked before
    any work; where dot's list of formats cannot be read, drawing is left to tell)."""
    if tc.graph.dot_program() is None:
        raise UsageError(f"drawing {out.name} needs Graphviz's dot program (apt-get install graphviz); "
                         f"--out FILE.dot writes the graph's text without it ({SUFFIX_TEXT} need dot)")
    offered = tc.graph.dot_formats()
    wanted = out.suffix.lower()[1:]
    if offered is None or wanted in offered:
        return
    usable = [name for name in (s[1:] for s in tc.graph.FORMATS) if name in offered]
    instead = f"use {', '.join('.' + name for name in usable)} or .dot" if usable else "use .dot (the text)"
    raise UsageError(f"--out {out}: Graphviz's dot here cannot write {wanted}; it offers {', '.join(offered)} "
                     f"({instead})")


def graph_loss(model, batch_size: int, seed: int = 0):
    """The training loss of one seeded random batch of ``model``'s geometry (labels 0, 1, ...): the
    graph a training step records."""
    geometry = model.config
    rng = np.random.default_rng(seed)
    images = rng.random((batch_size, geometry["in_channels"], geometry["image_size"], geometry["image_size"]),
                        dtype=np.float32)
    with tc.backend.on_device(model.device):
        dtype = next(iter(model.parameters())).dtype
        x = tc.tensor(images.astype(dtype), device=model.device)
        labels = tc.backend.asarray_like(np.arange(batch_size) % geometry["num_classes"], x.data)
        model.train()
        if isinstance(model, BaselineCNN):
            return tc.functional.cross_entropy(model(x), labels)
        outputs = model(x, labels)
        return model.loss(outputs, x, labels)


def expand_choice(text):
    """argparse type of ``--expand``: "all", "none" or a routing iteration number >= 1."""
    if text in tc.graph.EXPAND_WORDS:
        return text
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be all, none or a routing iteration number, got {text!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be all, none or a routing iteration number >= 1, got {number}")
    return number


DEFAULT_EXPANDED = 2  # the first iteration with every step of an iterative routing (the first has no softmax)


def chosen_expand(expand, iterations: list):
    """What ``--expand`` draws for a graph with routing ``iterations`` (their numbers): the option
    as given, checked (UsageError for an iteration the graph lacks), or by default iteration 2, else
    the only one, else everything (a graph without routing iterations)."""
    if expand is None:
        if not iterations:
            return "all"
        return DEFAULT_EXPANDED if DEFAULT_EXPANDED in iterations else iterations[0]
    if isinstance(expand, int) and expand not in iterations:
        have = (f"routing iterations {iterations[0]} to {iterations[-1]}" if len(iterations) > 1 else
                f"one routing iteration ({iterations[0]})" if iterations else "no routing iteration")
        raise UsageError(f"--expand {expand}: this model's graph has {have}; use one of them, all or none")
    return expand


def expand_text(expand, iterations: list, backward: bool) -> str:
    """What was folded, for the command's report: "routing iteration 2 op by op, 1 and 3 folded"."""
    if not iterations:
        return "every op drawn (no routing iteration to fold)"
    if expand == "all":
        return "every op drawn"
    others = [str(n) for n in iterations if n != expand]
    listed = " and ".join(others) if len(others) < 3 else ", ".join(others[:-1]) + " and " + others[-1]
    text = (f"routing iterations {listed} folded" if expand == "none" else
            f"routing iteration {expand} op by op" + (f", {listed} folded" if others else ""))
    return text + (", and the backward of each other op" if backward else "") + " (--expand all draws every op)"


HELP = "draw the graph one training batch records (routing iterations boxed)"


def add_arguments(parser) -> None:
    """The options of ``tinygrad-caps graph``."""
    parser.add_argument("--checkpoint", default=None, help="default: a freshly initialised model (the model options apply)")
    parser.add_argument("--out", required=True, metavar="FILE.svg",
                        help="the drawing: .svg, .png or .pdf (with Graphviz's dot), or .dot (the text itself)")
    parser.add_argument("--backward", action="store_true",
                        help="also draw the graph of the gradients (a create_graph=True backward: grad-of-grad)")
    parser.add_argument("--expand", type=expand_choice, default=None, metavar="{all,none,N}",
                        help="what to draw op by op: all, none, or routing iteration N (the other iterations and the "
                             "backward of each other op folded into one node each); default: iteration 2, or the "
                             "only one")
    parser.add_argument("--batch-size", type=positive_int, default=1)
    parser.add_argument("--seed", type=seed, default=0, help="the batch, and a fresh model's initialisation")
    parser.add_argument("--device", default="auto")
    add_model_options(parser, defaults=False)


def run(args) -> int:
    """Run the command for parsed ``args``; returns the exit status."""
    out = check_graph_path(args.out)
    if out.suffix.lower() != ".dot":
        check_dot_can_draw(out)
    overrides = {k: getattr(args, k) for k in MODEL_OPTIONS if getattr(args, k, None) is not None}
    if args.checkpoint:
        if not Path(args.checkpoint).is_file():
            raise UsageError(f"--checkpoint {args.checkpoint}: no such file")
        model, _ = load_checkpoint_model(args.checkpoint, overrides, args.device)
    else:
        tc.manual_seed(args.seed)
        model = build_model(dict(overrides, **GEOMETRY)).to(device=device_or_usage_error(args.device))
    loss = graph_loss(model, args.batch_size, args.seed)
    iterations = tc.graph.routing_iterations(loss)
    expand = chosen_expand(args.expand, iterations)
    options = dict(params=model, show_backward=args.backward, expand=expand)
    if out.suffix.lower() == ".dot":
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(tc.graph.to_dot(loss, **options))
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        tc.graph.draw(loss, out, **options)
    counts = tc.graph.tape_counts(loss)
    print(f"{counts['ops']} ops, {counts['leaves']} leaves, {counts['edges']} edges in the forward graph"
          f"{', drawn with its backward graph' if args.backward else ''}; {expand_text(expand, iterations, args.backward)}")
    print(f"written: {out}")
    return 0
