"""``tinygrad-caps train``: the run's one TrainingConfig from the command line (with ``--resume``, the
run's own options; ``--preset``'s as defaults), checked, then trained on one process, under mpirun,
or profiled (``--profile``)."""
from __future__ import annotations

import datetime
from pathlib import Path

import tinygrad_caps as tc

from ...errors import UsageError
from ..training.option_checks import check_out_folder
from ..training.progress import bars_wanted
from ..training.run_folder import RunFolder
from ..training.run_options import saved_run_options
from .model_options import positive_int
from .training_options import add_training_options, may_change_on_resume, training_config_from_args

HELP = "train a CapsNet or the paper's baseline CNN (--model cnn)"


def add_arguments(parser) -> None:
    """The options of ``tinygrad-caps train``: every field of TrainingConfig, the model's options,
    and where the run goes (``--out``, ``--resume``, ``--profile``, ``--no-progress``)."""
    add_training_options(parser)
    parser.add_argument("--out", default=None, help="run folder (default: a new folder under runs/)")
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true", help="continue the run in --out from checkpoints/last.npz")
    resume.add_argument("--resume-or-start", action="store_true",
                        help="continue the run in --out where it holds one, else start it there (for job scripts "
                             "that run one command until the run has finished)")
    parser.add_argument("--profile", type=positive_int, default=None, metavar="N",
                        help="profile N training batches, print the time per op and exit (writes nothing)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")


def run(args):
    """``train``: build the run's one TrainingConfig from ``args`` and train; returns the exit status."""
    resume = args.resume or args.resume_or_start
    if resume and not args.out:
        raise UsageError(f"{'--resume' if args.resume else '--resume-or-start'} needs --out, the run folder to "
                         "continue")
    out = Path(args.out) if args.out else Path("runs") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    saved = saved_run_options(out) if resume and not args.profile else None
    if resume and not args.profile and saved is None:
        if args.resume:
            raise UsageError(no_run_to_resume(out))
        resume = False  # --resume-or-start where no run is: start one
    first_rank = (tc.distributed.launcher_rank() or 0) == 0  # one report, not one per mpirun rank
    config, _ = training_config_from_args(args, saved, may_change=may_change_on_resume(own_parser()),
                                          log=print if first_rank else lambda text: None)
    if args.profile:
        from . import profile

        return profile.run(config, args.profile)
    check_out_folder(out, resume)
    if config.tensorboard:  # (its default, RUN/tensorboard, is checked with --out)
        check_out_folder(Path(config.tensorboard), resume=True, option="--tensorboard")
    if out.exists() and not resume and RunFolder(out).metrics.exists():
        raise UsageError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    # the Trainer prints "run folder: ..." once it has created it, after the first batch
    if args.distributed:
        from ..training.distributed import abort_on_error, train_distributed

        with abort_on_error("train", args.debug):
            train_distributed(config, out, resume=resume, show_progress=bars_wanted(args.no_progress),
                              sync_batchnorm=args.sync_batchnorm)
        return 0
    if args.sync_batchnorm:
        raise UsageError("--sync-batchnorm needs --distributed")
    started = tc.distributed.launcher_world_size()
    if started and started > 1:  # several independent runs would write into one --out
        raise UsageError(f"mpirun started {started} processes: add --distributed to train one model on all of them")
    from ..training.trainer import train  # the training loop (and the dataset code) only when a run trains

    train(config, out, resume=resume, show_progress=bars_wanted(args.no_progress))
    return 0


def own_parser():
    """A parser of ``train``'s options alone (what its refusals list is derived from)."""
    import argparse

    parser = argparse.ArgumentParser(prog="tinygrad-caps train", add_help=False)
    add_arguments(parser)
    return parser


def no_run_to_resume(out: Path) -> str:
    """The one-line refusal of ``--resume --out OUT`` where OUT holds no run (a typo, a fresh folder)."""
    where = f"{out} does not exist" if not out.exists() else f"{out} holds no run (no config.json)"
    return (f"--resume: {where}; to start a run there, give the same command without --resume (or with "
            "--resume-or-start, which starts or continues)")
