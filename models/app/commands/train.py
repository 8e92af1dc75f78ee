"""``tinygrad-caps train``: the run's config from the command line (with ``--resume``, the run's own
options; ``--preset``'s as defaults), checked, then trained on one process, under mpirun, or
profiled (``--profile``)."""
from __future__ import annotations

import datetime
from pathlib import Path

import tinygrad_caps as tc

from ...capsnet.config import CNN_OPTIONS, MODEL_OPTIONS
from ...errors import UsageError
from ..option_checks import check_out_folder
from ..progress import bars_wanted
from ..run_options import (CAPSULE_TRAINING_OPTIONS, NOT_RUN_OPTIONS, capsule_only_options, option_flag,
                           resumed_options, saved_run_options)
from ..training import train


def run(args):
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
        if saved is None:
            raise UsageError(no_run_to_resume(out))
        first_rank = (tc.distributed.launcher_rank() or 0) == 0  # one report, not one per mpirun rank
        config = resumed_options(config, explicit, saved, log=None if first_rank else lambda text: None)
    config = model_options(config, explicit)
    if args.profile:
        from . import profile

        return profile.run(config, args.profile)
    check_out_folder(out, args.resume)
    if out.exists() and not args.resume and (out / "metrics.jsonl").exists():
        raise UsageError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    # the Trainer prints "run folder: ..." once it has created it, after the first batch
    if args.distributed:
        from ..distributed_training import abort_on_error, train_distributed

        with abort_on_error("train", args.debug):
            train_distributed(config, out, resume=args.resume, show_progress=bars_wanted(args.no_progress),
                              sync_batchnorm=args.sync_batchnorm)
        return 0
    if args.sync_batchnorm:
        raise UsageError("--sync-batchnorm needs --distributed")
    started = tc.distributed.launcher_world_size()
    if started and started > 1:  # several independent runs would write into one --out
        raise UsageError(f"mpirun started {started} processes: add --distributed to train one model on all of them")
    train(config, out, resume=args.resume, show_progress=bars_wanted(args.no_progress))
    return 0


def no_run_to_resume(out: Path) -> str:
    """The one-line refusal of ``--resume --out OUT`` where OUT holds no run (a typo, a fresh folder)."""
    where = f"{out} does not exist" if not out.exists() else f"{out} holds no run (no config.json)"
    return f"--resume: {where}; to start a run there, give the same command without --resume"


def model_options(config: dict, explicit: set) -> dict:
    """``config`` with only the chosen model's options: for ``--model cnn`` the CapsNet-only options,
    for a CapsNet the CNN-only ones, given explicitly, are refused (UsageError); the other model's
    options are left out (and the CNN's unset sizes too), so ``config.json`` records only what the
    model uses."""
    if config["model"] == "cnn":
        given = capsule_only_options(explicit, MODEL_OPTIONS)
        if given:
            raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to CapsNet only, "
                             "not to --model cnn (the baseline CNN has no capsules, routing or decoder)")
        left_out = MODEL_OPTIONS + CAPSULE_TRAINING_OPTIONS
    else:
        given = [option_flag(name) for name in CNN_OPTIONS if name in explicit]
        if given:
            raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to --model cnn only "
                             "(the baseline CNN's sizes), not to CapsNet")
        left_out = CNN_OPTIONS
    return {k: v for k, v in config.items() if k not in left_out and not (k in CNN_OPTIONS and v is None)}
