"""``tinygrad-caps plot RUN``: a training run's loss, accuracy and gradient-flow curves, from its logs."""
from __future__ import annotations

import json
from pathlib import Path

from ...analysis.plots import plot_metrics
from ...errors import UsageError
from ..training.option_checks import check_out_folder
from ..training.output_paths import check_picture_path, picture_help
from ..training.run_folder import RunFolder
from ..training.tensorboard_log import export_tensorboard
from ..training.run_logs import read_gradflow, read_metrics
from ..studies.folder import StudyFolder
from ..studies.plan import StudyPlan


def plot_run(run_dir, out=None) -> Path:
    """Loss and accuracy per epoch from ``RUN/metrics.jsonl`` and, when ``RUN/gradflow.jsonl`` exists,
    |grad u_hat| per iteration and path and 1 - the coupling entropy per iteration over the training
    steps. Every line of both logs is checked first (UsageError naming the file, line and reason).

    Returns the picture's path (``out``, default ``RUN/plot.png``; .png, .pdf or .svg).
    """
    run_dir = Path(run_dir)
    metrics_path, gradflow_path = RunFolder(run_dir).metrics, RunFolder(run_dir).gradflow
    if not run_dir.exists():
        raise UsageError(f"{run_dir} does not exist")
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is a file, not a run folder")
    if not metrics_path.exists():
        raise UsageError(f"{run_dir} holds no metrics.jsonl; is it a training run folder?")
    out = check_picture_path(out if out else run_dir / "plot.png", "--out")
    metrics = read_metrics(metrics_path)
    gradflow = read_gradflow(gradflow_path) if gradflow_path.exists() else []
    if not metrics and not gradflow:
        raise UsageError(f"{metrics_path} holds no finished epoch yet, and there is no gradflow.jsonl: nothing to plot")
    plot_metrics(metrics, gradflow, out, run_name(run_dir))
    return out


def run_name(run_dir) -> str:
    """The name a run's picture gives it: its folder's name, and for a run of a study
    (STUDY/runs/CONFIG/seed-S, the configuration in STUDY/study.json) also the configuration, its own
    options and the study, e.g. "seed-0: configuration routing3-full (routing_iterations=3) of study
    gradient-modes"."""
    run_dir = Path(run_dir).absolute()
    name = run_dir.name
    study = StudyFolder.around(run_dir)
    if study is None:
        return name
    try:
        plan = StudyPlan.load(study)
    except UsageError:  # an unreadable study.json costs the title its configuration, not the picture
        return name
    for config in plan.configs if plan is not None else ():
        if any(study.run(run.config_id, run.seed).path == run_dir for run in config.runs):
            options = ", ".join(f"{k}={json.dumps(v)}" for k, v in config.options.items())
            return (f"{name}: configuration {config.config_id}" + (f" ({options})" if options else "")
                    + f" of study {plan.study}")
    return name


HELP = "loss, accuracy and gradient-flow curves of a training run"


def add_arguments(parser) -> None:
    """The options of ``tinygrad-caps plot``."""
    parser.add_argument("run", metavar="RUN", help="a run folder (with metrics.jsonl, and gradflow.jsonl if logged)")
    parser.add_argument("--out", default=None, metavar="FILE.png", help=picture_help("RUN/plot.png"))
    parser.add_argument("--tensorboard-out", default=None, metavar="DIR",
                        help="also export the run's metrics.jsonl and gradflow.jsonl as TensorBoard event files in DIR")


def run(args) -> int:
    """Run the command for parsed ``args``; returns the exit status."""
    if args.tensorboard_out is not None:
        check_out_folder(Path(args.tensorboard_out), resume=True, option="--tensorboard-out")
    print(f"written: {plot_run(args.run, args.out)}")
    if args.tensorboard_out is not None:
        print(f"written: {export_tensorboard(args.run, args.tensorboard_out)} (TensorBoard)")
    return 0
