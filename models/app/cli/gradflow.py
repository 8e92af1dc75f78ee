"""``tinygrad-caps gradflow``: the gradient-flow report of a checkpoint (or of a freshly initialised
model) on a few training batches, as ``DIR/gradflow.json``, ``DIR/gradflow.png`` and a table."""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.data import dataset_spec

from ...analysis.figures import fixed_text, layer_values, line_columns, line_value, norm_text, table_columns
from ...analysis.gradflow import check_mode, gradient_flow_report, mean_of_reports, supported_modes
from ...analysis.plots import plot_gradflow, pyplot
from ...capsnet.baseline_cnn import BaselineCNN
from ...capsnet.config import MODEL_OPTIONS
from ...capsnet.routing import GRADIENT_MODES, unknown_mode_refusal
from ...errors import UsageError
from ..training.checkpoints import build_model, checkpoint_dataset_spec, load_checkpoint_model
from ..training.option_checks import check_out_folder, device_or_usage_error, seed
from ..training.output_paths import PICTURE_SUFFIXES, check_writable_file
from ..training.progress import bars_wanted, progress_shown
from .model_options import add_model_options, positive_int


def parse_modes(text: str | None, model=None) -> tuple:
    """"full,detach" -> ("full", "detach"); UsageError for an unknown or repeated mode, or one that a
    routing layer of ``model`` does not take. None: every mode the model's routing layers take."""
    if text is None:
        return supported_modes(model) if model is not None else GRADIENT_MODES
    modes = tuple(part.strip() for part in text.split(",") if part.strip())
    if not modes:
        raise UsageError(f"--modes: give one or more of {', '.join(GRADIENT_MODES)}, separated by commas")
    unknown = next(filter(None, map(unknown_mode_refusal, modes)), None)
    if unknown:
        raise UsageError(f"--modes: {unknown}")
    if len(set(modes)) != len(modes):
        raise UsageError(f"--modes: a mode is repeated in {text!r}")
    for mode in modes if model is not None else ():
        try:
            check_mode(model, mode, "--modes")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return modes


def check_report_folder(out) -> Path:
    """Raise UsageError unless ``out`` can be the report's folder: a writable folder (made if missing)
    whose gradflow.json and gradflow.png can be written. A name ending in a picture's or JSON's suffix
    is refused unless that folder exists: gradflow writes a folder, not a file. Creates nothing."""
    out = Path(out)
    if out.suffix.lower() in PICTURE_SUFFIXES + (".json",) and not os.path.isdir(out):
        raise UsageError(f"--out {out} names a {out.suffix} file, but gradflow writes a folder (DIR/gradflow.json "
                         "and DIR/gradflow.png); give a folder name")
    check_out_folder(out, resume=True)
    for name in ("gradflow.json", "gradflow.png"):
        check_writable_file(out / name, "--out")
    return out


def _model_and_data(args):
    """(model, dataset name, data dir, spec, where the model came from)."""
    overrides = {k: getattr(args, k) for k in MODEL_OPTIONS if getattr(args, k, None) is not None}
    if args.checkpoint:
        if not Path(args.checkpoint).is_file():
            raise UsageError(f"--checkpoint {args.checkpoint}: no such file")
        model, config = load_checkpoint_model(args.checkpoint, overrides, args.device)
        dataset = args.dataset or config.get("dataset") or "fashion-mnist"
        data_dir = args.data_dir or config.get("data_dir")
        spec = checkpoint_dataset_spec(config, dataset, data_dir, args.checkpoint)
        source = str(args.checkpoint)
    else:
        dataset, data_dir = args.dataset or "fashion-mnist", args.data_dir
        spec = dataset_spec(dataset, data_dir)
        tc.manual_seed(args.seed)
        config = dict(overrides, in_channels=spec.channels, image_size=spec.image_size, num_classes=spec.num_classes)
        model = build_model(config).to(device=device_or_usage_error(args.device))
        source = f"fresh initialisation (seed {args.seed})"
    if isinstance(model, BaselineCNN):
        raise UsageError("gradflow needs a CapsNet; the baseline CNN has no routing")
    return model, dataset, data_dir, spec, source


HELP = "how the gradient flows through routing, per mode, iteration and path"


def add_arguments(parser) -> None:
    """The options of ``tinygrad-caps gradflow``."""
    parser.add_argument("--checkpoint", default=None, help="default: a freshly initialised model (the model options apply)")
    parser.add_argument("--dataset", default=None, help="default: the checkpoint's, else fashion-mnist")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--batches", type=positive_int, default=4, help="training batches; the figures are their means")
    parser.add_argument("--modes", default=None, help="routing-gradient modes to compare, comma-separated (default: "
                                                 "full,detach, or full alone where the routing is not iterative)")
    parser.add_argument("--hessian-iterations", type=int, default=0,
                        help="power iterations for the top Hessian eigenvalue of the loss in digit.weight (0: none)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=seed, default=0, help="which batches, and a fresh model's initialisation")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="a folder: writes DIR/gradflow.json and DIR/gradflow.png (default: a new folder under runs/)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (none is shown unless stderr is a terminal)")
    add_model_options(parser, defaults=False)


def run(args) -> int:
    """Run the command for parsed ``args``; returns the exit status."""
    parse_modes(args.modes)  # the mode names, before any data is read
    if args.hessian_iterations < 0:
        raise UsageError(f"--hessian-iterations must be >= 0, got {args.hessian_iterations}")
    out = Path(args.out) if args.out else Path("runs") / datetime.datetime.now().strftime("gradflow-%Y%m%d-%H%M%S")
    check_report_folder(out)
    model, dataset, data_dir, spec, source = _model_and_data(args)
    modes = parse_modes(args.modes, model)
    images, labels = spec.load("train", data_dir)
    wanted = args.batches * args.batch_size
    if wanted > len(labels):
        raise UsageError(f"--batches {args.batches} of --batch-size {args.batch_size} need {wanted} images; "
                         f"{dataset} has {len(labels)} training images")
    chosen = np.random.default_rng(args.seed).choice(len(labels), size=wanted, replace=False)
    reports = []
    with progress_shown(args.batches, "gradflow", bars_wanted(getattr(args, "no_progress", False)), unit="batch") as bar:
        for k in range(args.batches):
            rows = chosen[k * args.batch_size:(k + 1) * args.batch_size]
            x = spec.preprocess(images[rows], train=False)
            reports.append(gradient_flow_report(model, tc.tensor(x, device=model.device), labels[rows], modes,
                                                args.hessian_iterations))
            if bar is not None:
                bar.update(1)
    report = mean_of_reports(reports)
    report["config"].update(source=source, dataset=dataset, batches=args.batches, seed=args.seed,
                            device=model.device, dtype=str(model.digit.weight.dtype))
    out.mkdir(parents=True, exist_ok=True)
    (out / "gradflow.json").write_text(json.dumps(report, indent=2))
    print(format_report(report))
    print(f"written: {out / 'gradflow.json'}")
    if pyplot() is None:
        print("gradflow.png not drawn: matplotlib is not installed (pip install 'tinygrad-caps[viz]')")
    else:
        plot_gradflow(report, out / "gradflow.png")
        print(f"written: {out / 'gradflow.png'}")
    return 0


def _d_sources(network: dict) -> str:
    """"; D from activations" (or lengths, or "hidden from ..., DigitCaps from ...") for the network
    line: what its D-scores were taken from; "" where the report does not say."""
    hidden, digit = network.get("d_score_from"), network.get("digit_d_score_from")
    if not digit:
        return ""
    if hidden in (None, digit):
        return f"; D from {digit}"
    return f"; D from {hidden} (hidden), {digit} (DigitCaps)"


def format_report(report: dict) -> str:
    """The report as a table per mode and routing layer (a column per figure of ``table_columns``;
    a line per mode for each of ``line_columns``), then the parameter gradient norms and cosines."""
    config = report["config"]
    lines = [f"gradient flow: {config.get('source', 'model')}, {config.get('batches', 1)} batch(es) of "
             f"{config['batch_size']} (means over batches)"]
    columns = table_columns()
    header = f"  {'r':>2}" + "".join(f" {figure.column.header:>{figure.column.width}}" for figure in columns)
    for mode, result in report["modes"].items():
        eigen = result.get("hessian_top_eigenvalue")
        lines.append(f"mode {mode}: loss {result['loss']:.5f}"
                     + (f", top Hessian eigenvalue (digit.weight) {eigen:.5g}" if eigen is not None else ""))
        for layer in result["layers"]:
            source = layer.get("d_score_from")
            lines.append(f" layer {layer['name']}" + (f" (D from {source})" if source else ""))
            lines.append(header)
            values = [layer_values(figure, layer["iterations"]) for figure in columns]
            for r, row in enumerate(layer["iterations"]):
                lines.append(f"  {row['iteration']:>2}"
                             + "".join(f" {figure.column.text(column[r])}" for figure, column in zip(columns, values)))
        network = result.get("network")
        if network:
            hidden = "no hidden layer" if network["d_score"] is None else norm_text(network["d_score"])
            lines.append(f" network: T-score {norm_text(network['t_score'])} (mean over routing layers, last "
                         f"iteration), D-score {hidden} (hidden layers; DigitCaps' own D "
                         f"{norm_text(network['digit_d_score'])})" + _d_sources(network))
        line = dict(result, mode_cosine=report.get("mode_cosine"))
        for figure in line_columns():
            lines.append(f" {figure.column.header}: {figure.column.format(line_value(figure, line))}")
    modes = list(report["modes"])
    names = list(report["modes"][modes[0]]["parameter_grad_norms"])
    lines.append("parameter gradient norms" + (" and cosine between modes" if report.get("mode_cosine") else ""))
    width = max([22] + [len(name) for name in names])  # primary_activations.conv.weight is longer
    lines.append(f"  {'parameter':<{width}}" + "".join(f"{m:>12}" for m in modes)
                 + (f"{'cosine':>11}" if report.get("mode_cosine") else ""))
    for name in names:
        row = f"  {name:<{width}}" + "".join(f"{norm_text(report['modes'][m]['parameter_grad_norms'][name]):>12}"
                                             for m in modes)
        if report.get("mode_cosine"):
            row += f"{fixed_text(report['mode_cosine'].get(name), 6):>11}"
        lines.append(row)
    return "\n".join(lines)
