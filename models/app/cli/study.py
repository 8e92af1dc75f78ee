"""``tinygrad-caps study list | run NAME | summary DIR``: the registered studies, training one over
its configurations and seeds (``studies.runner``, ``studies.driver``), and its summary
(``studies.summary``)."""
from __future__ import annotations

import contextlib
import shlex
import time
from pathlib import Path

from ...errors import UsageError
from ..training.option_checks import check_out_folder, positive_float
from ..training.progress import bars_wanted
from ..studies.registry import MAX_DEPTH, STUDIES, get_study
from ..studies.driver import drive_runs, print_failures
from ..studies.executors import executor_for
from ..studies.folder import StudyFolder
from ..studies.lock import study_lock
from ..studies.outcome import Outcome
from ..studies.placement import EXECUTORS, SCHEDULING_OPTIONS, study_placement
from ..studies.plan import StudyPlan
from ..studies.runner import STUDY_ONLY, parse_seed_list, plan_study
from ..studies.summary import plural, summary_markdown, write_summary
from ..training.config import STUDY_OPTIONS
from ..training.run_options import option_flag
from ..training.tensorboard_log import export_tensorboard
from .model_options import positive_int
from .training_options import add_training_options, mark_may_change, may_change_on_resume

MAX_SEEDS = 1000  # seeds of one study: --seeds N and --seed-list's count


def list_studies() -> str:
    """One line per registered study: its name, what it varies, its default budget and configurations."""
    width = max(len(name) for name in STUDIES)
    lines = []
    for name, study in STUDIES.items():
        count = len(study.configurations())
        lines.append(f"{name:<{width}}  {study.varies}; default {study.budget()}, {count} configuration{'s' * (count != 1)}")
    return "\n".join(lines)


HELP = "run a registered study over configurations and seeds, with a summary"


def add_arguments(parser) -> None:
    """``study list``, ``study run NAME`` (with the training options a study may set) and ``study summary DIR``."""
    actions = parser.add_subparsers(dest="study_command", required=True)
    actions.add_parser("list", help="one line per registered study: name, what it varies, default budget")
    r = actions.add_parser("run", help="train every configuration of a study with every seed, then summarise")
    r.add_argument("name", metavar="NAME", help="a registered study (see study list)")
    r.add_argument("--out", required=True, metavar="DIR",
                   help="the study's folder: DIR/runs/CONFIG/seed-S/ (run folders), DIR/study.json, DIR/summary.*")
    seeds = r.add_argument("--seeds", type=positive_int, default=None, metavar="N",
                           help="seeds 0..N-1 (default: the study's)")
    seed_list = r.add_argument("--seed-list", default=None, metavar="S,S,...", help="these seeds instead of 0..N-1")
    r.add_argument("--max-minutes", type=positive_float, default=None, metavar="M",
                   help="stop at the first batch boundary after M minutes, save, and say how to continue "
                        f"(exit {Outcome.STOPPED.exit_code})")
    resume = r.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true",
                        help="continue the study in --out: finished runs are skipped, interrupted ones continue "
                             "exactly")
    resume.add_argument("--resume-or-start", action="store_true",
                        help="continue the study in --out where it holds one (as --resume), else start it there: "
                             "one command for a job script to run until the study has finished")
    max_depth = r.add_argument("--max-depth", type=positive_int, default=None, metavar="K",
                               help="depth: 0 to K hidden capsule layers (default 3)")
    tensorboard_out = r.add_argument("--tensorboard-out", default=None, metavar="TB",
                                     help="also export every run's logs as TensorBoard event files: TB/CONFIG/seed-S/")
    r.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    mark_may_change(seeds, seed_list, max_depth, tensorboard_out)
    add_scheduling_options(r)
    add_training_options(r, [name for name in STUDY_OPTIONS if name != "model"])  # the configurations choose the model
    r.set_defaults(epochs=None)
    next(action for action in r._actions if action.dest == "epochs").help = "epochs of every run (default: the study's)"
    m = actions.add_parser("summary", help="write DIR/summary.json, .md and .png from a study's finished runs")
    m.add_argument("out", metavar="DIR", help="a study folder (with study.json)")
    m.add_argument("--tensorboard-out", default=None, metavar="TB",
                   help="also export every run's logs as TensorBoard event files: TB/CONFIG/seed-S/")


def add_scheduling_options(parser) -> None:
    """Where the runs train: ``--jobs`` and the other options of ``placement.study_placement``."""
    g = parser.add_argument_group("where the runs train (docs/studies.md, \"Many runs at once\", \"On a cluster\")")
    g.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="runs at a time, each in its own process (default 1; on GPUs: every device slot)")
    g.add_argument("--threads-per-run", type=int, default=None, metavar="T",
                   help="engine and BLAS threads of each run (default: the usable CPUs divided by the runs at a time)")
    g.add_argument("--devices", default=None, metavar="cuda:0,cuda:1",
                   help="the GPUs to place runs on (default with --device cuda/auto: every visible GPU)")
    g.add_argument("--runs-per-device", type=int, default=None, metavar="K",
                   help="runs at a time on each GPU (default 1)")
    g.add_argument("--executor", default="local", choices=EXECUTORS,
                   help="local: processes on this machine (default); ray: Ray tasks on a Ray cluster")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="the Ray cluster (default: $RAY_ADDRESS, else a local Ray started for the study)")
    g.add_argument("--cpus-per-run", type=float, default=None, metavar="C", help="Ray: CPUs of each run (default 1)")
    g.add_argument("--gpus-per-run", type=float, default=None, metavar="G",
                   help="Ray: GPUs of each run; 0.5 puts two runs on a GPU (default: 1 on GPUs, else 0)")
    g.add_argument("--max-retries", type=int, default=None, metavar="R",
                   help="start a run again this often when its process, worker or node dies (default 3)")
    mark_may_change(*g._group_actions)  # (a started run keeps its thread count unless --threads-per-run is given)


def run(args) -> int:
    """Run the command for parsed ``args``; returns the exit status."""
    if args.study_command == "list":
        print(list_studies())
        return 0
    if getattr(args, "tensorboard_out", None) is not None:  # before any training
        check_out_folder(Path(args.tensorboard_out), resume=True, option="--tensorboard-out")
    if args.study_command == "summary":
        report_summary(args.out, args.tensorboard_out)
        return 0
    return run_study(args)


def export_study_tensorboard(out, folder) -> list:
    """Export every run of the study in ``out`` (a StudyFolder or its path) that has logs
    (metrics.jsonl or gradflow.jsonl) as TensorBoard event files in ``folder``/CONFIG/seed-S/, so
    TensorBoard shows one run per configuration and seed; returns the folders written."""
    study = StudyFolder.of(out)
    plan = StudyPlan.load(study)
    if plan is None:
        raise UsageError(f"{study} holds no study.json: not a study folder")
    written = []
    for run in plan.runs():
        logs = study.run(run.config_id, run.seed)
        if logs.metrics.exists() or logs.gradflow.exists():
            written.append(export_tensorboard(logs.path, Path(folder) / run.config_id / f"seed-{run.seed}"))
    return written


def report_summary(out, tensorboard_out=None, redraw: bool = True) -> None:
    """Write and print the study's summary and one line per summary file: ``written: PATH``, or
    ``unchanged: PATH`` where it held the summary already, or ``not drawn: PATH (why; how to get
    it)``; with ``tensorboard_out``, export its runs there too. ``redraw=False`` (a study run):
    a summary.png drawn from this summary is kept without drawing it again."""
    summary = write_summary(out, redraw=redraw)
    print(summary_markdown(summary), end="")
    for path in summary["written"]:
        print(f"written: {path}")
    for path in summary.get("unchanged", ()):
        print(f"unchanged: {path}")
    for picture in summary.get("not_drawn", ()):
        print(f"not drawn: {picture}")
    if tensorboard_out is not None:
        runs = export_study_tensorboard(out, tensorboard_out)
        print(f"written: {tensorboard_out} (TensorBoard, {plural(len(runs), 'run')})")


def study_seeds(args):
    """The seeds ``--seeds`` or ``--seed-list`` give (None: the study's, or the saved plan's);
    UsageError for both, or for more than MAX_SEEDS."""
    if args.seeds is not None and args.seed_list is not None:
        raise UsageError("give --seeds N or --seed-list S,S,..., not both")
    if args.seeds is not None and not 1 <= args.seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds must lie in [1, {MAX_SEEDS}], got {args.seeds}")
    if args.seed_list is None:
        return list(range(args.seeds)) if args.seeds is not None else None
    seeds = parse_seed_list(args.seed_list)
    if len(seeds) > MAX_SEEDS:
        raise UsageError(f"--seed-list: at most {MAX_SEEDS} seeds, got {len(seeds)}")
    return seeds


def study_parameters(args) -> dict:
    """The study parameters the command line gives (``--max-depth``, checked against its range)."""
    if args.max_depth is None:
        return {}
    if not 1 <= args.max_depth <= MAX_DEPTH:
        raise UsageError(f"--max-depth must lie in [1, {MAX_DEPTH}], got {args.max_depth}")
    return {"max_depth": args.max_depth}


@contextlib.contextmanager
def removed_if_refused(folder: StudyFolder):
    """Where the block raises a UsageError, remove the study ``folder`` if it holds nothing but its
    lock (the refusal then leaves nothing behind once the lock is released)."""
    try:
        yield
    except UsageError:
        if {p.name for p in folder.path.iterdir()} <= {folder.lock.name}:
            folder.lock.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.path.rmdir()
        raise


def run_study(args) -> int:
    """``study run NAME``: plan (or continue) the study, train its runs, write its summary."""
    try:
        study = get_study(args.name)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    explicit = set(getattr(args, "explicit", set()))
    seeds = study_seeds(args)
    given = {k: v for k, v in vars(args).items() if k not in STUDY_ONLY}
    command = "tinygrad-caps " + shlex.join(getattr(args, "command_line", None) or ["study", "run", args.name])
    folder = StudyFolder(args.out)
    # --resume-or-start: --resume where the folder holds a study, else a start (refused where it holds runs/)
    resume = args.resume or (args.resume_or_start and folder.holds_a_study())
    plan = plan_study(study, args.out, given, explicit - set(STUDY_ONLY), seeds=seeds, epochs=args.epochs,
                      parameters=study_parameters(args), resume=resume, command=command,
                      tensorboard_out=args.tensorboard_out, may_change=may_change_on_resume(run_parser()))
    if plan.tensorboard_out is not None and args.tensorboard_out is None:  # the saved one, checked as a given one is
        check_out_folder(Path(plan.tensorboard_out), resume=True, option="--tensorboard-out")
    placement = study_placement({key: getattr(args, key, None) for key in SCHEDULING_OPTIONS},
                                plan.options.get("device", "auto"))
    resume_command = plan.continue_command(args.out, scheduling_words(args, explicit))
    plan.check_runs()  # every configuration, before anything is written
    show_progress = bars_wanted(args.no_progress)
    with executor_for(placement, folder, show_progress=show_progress) as executor, study_lock(folder):
        with removed_if_refused(folder):
            executor.prepare()  # (Ray: can every node see the folder?)
        plan.save(folder)
        deadline = time.monotonic() + 60 * args.max_minutes if args.max_minutes else None
        result = drive_runs(plan, folder, executor, deadline=deadline, show_progress=show_progress,
                            max_retries=placement.max_retries if executor.retries_runs else 0,
                            resume_command=resume_command)
        report_summary(folder, plan.tensorboard_out, redraw=False)
    if result.stopped:
        print(f"stopped after {plural(args.max_minutes, 'minute')} with {result.finished} of "
              f"{plural(result.total, 'run')} finished; continue with: {resume_command}")
        return Outcome.STOPPED.exit_code
    if result.failed:
        print_failures(result)
        print(f"{plural(len(result.failed), 'run')} failed, {result.finished} of "
              f"{plural(result.total, 'run')} finished; retry the failed with: {resume_command}")
        return Outcome.FAILED.exit_code
    return Outcome.FINISHED.exit_code


def scheduling_words(args, explicit) -> list:
    """The scheduling options (``--jobs 2``, ``--threads-per-run 1``, ...) that ``args`` gives
    explicitly, as command-line words: what the printed continue command repeats."""
    words = []
    for key in SCHEDULING_OPTIONS:
        value = getattr(args, key, None)
        if key in explicit and value is not None:
            words += [option_flag(key), f"{value:g}" if isinstance(value, float) else str(value)]
    return words


def run_parser():
    """A parser of ``study run``'s options alone (what its refusals list is derived from)."""
    import argparse

    parser = argparse.ArgumentParser(prog="tinygrad-caps study", add_help=False)
    add_arguments(parser)
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return commands.choices["run"]
