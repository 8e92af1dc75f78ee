"""``study run``: every configuration of a registered study with every seed, each an ordinary run
folder trained by the ``Trainer``, then the summary (``summary.write_summary``).

The study folder DIR (``folder.StudyFolder`` names its files): DIR/study.json, the plan
(``plan.StudyPlan``: the study, the command, the package version, the options every run shares, the
seeds, the epochs and, per configuration, its config_id, options and runs); DIR/runs/<config_id>/
seed-<seed>/, a run folder as ``train`` writes it (with train.log, run.lock and failed.json);
DIR/summary.json, summary.md, summary.png; DIR/study.lock while a ``study run`` drives the folder;
DIR/study.stop and study.token while a stopped study's runs save, and for the Ray executor.

Where the runs train is the placement's (``placement.py``): one at a time in this process (the
default), in worker processes, or in Ray tasks; ``driver.drive_runs`` hands them to the executor
(``executors.executor_for``) either way, and every run is trained by ``run_task.train_study_run``.

Before anything is written, every configuration's first run is checked as ``train`` checks a run
before it reads its data (``StudyPlan.check_runs``: no Trainer is built, no image read), and the
folder is refused where it lies in a training run's folder or in another study's runs/
(``StudyFolder.check_place``). ``--resume`` of a folder without a study is refused
(``--resume-or-start`` starts one there, and continues one where it finds it).

``--resume`` takes the options the study was started with (those the command line does not give;
an option that changes what a run computes is refused, as in ``train --resume``), skips the runs
that have finished and continues the interrupted ones from their ``last.npz`` with ``train``'s
guarantee (the same metrics as a run never interrupted). A study run again over finished runs
rewrites nothing. ``--max-minutes`` stops at the first batch boundary after the time, saves the
run, writes the summary of what has finished, and exits with EX_TEMPFAIL (``Outcome.STOPPED``: run
the printed command, or the same with ``--resume-or-start``, to continue); every call trains at
least one batch first, so a loop of calls ends however short the limit. ``--tensorboard-out`` is
kept in the plan and honoured on resume.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import tinygrad_caps as tc

from ...errors import UsageError
from ..training.option_checks import check_out_folder
from ..training.run_options import option_flag, resumed_options
from .folder import StudyFolder
from .placement import SCHEDULING_OPTIONS
from .plan import PlannedConfig, PlannedRun, StudyPlan
from .registry import Study

# study run's own options; every other destination of its parser is a training option shared by the runs
STUDY_ONLY = ("command", "study_command", "name", "out", "seeds", "seed_list", "max_minutes", "resume",
              "resume_or_start", "max_depth",
              "debug", "explicit", "no_progress", "command_line", "tensorboard_out", *SCHEDULING_OPTIONS)


def command_without_resume(command: str) -> str:
    """``command`` (a study run command line) without its --resume: the command that starts the study."""
    words = [w for w in shlex.split(command) if not (len(w) > 4 and "--resume".startswith(w))]
    return shlex.join(words)


def parse_seed_list(text: str) -> list:
    """"0,3,7" -> [0, 3, 7]; UsageError for anything but distinct non-negative integers."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--seed-list: expected integers separated by commas, got {text!r}") from None
    if not seeds or any(s < 0 or s >= 2 ** 63 for s in seeds) or len(set(seeds)) != len(seeds):
        raise UsageError(f"--seed-list: expected distinct integers in [0, 2**63), got {text!r}")
    return seeds


def plan_study(study: Study, out, given: dict, explicit: set, *, seeds=None, epochs=None, parameters=None,
               resume=False, command="", log=print, tensorboard_out=None, may_change=None) -> StudyPlan:
    """The study's plan (what DIR/study.json holds), from the command line's training options
    ``given`` (all of them, defaults included; ``explicit`` those it set) and, with ``resume``, the
    saved plan. Raises UsageError for an option the study varies, a folder inside a training run's
    or another study's run folders, a folder that holds a study without ``resume`` or (with
    ``resume``) none, another study or a changed option (its message lists ``may_change``: the flags
    of ``study run`` that may change). ``tensorboard_out`` (else, on resume, the saved one) is kept
    in the plan, so a continued study exports its runs too."""
    out = Path(out)
    folder = StudyFolder(out)
    check_out_folder(out, resume)
    folder.check_place()
    saved = StudyPlan.load(folder)
    if saved is not None and not resume:
        raise UsageError(f"{out} holds a study already ({saved.study}); pass --resume to continue it or choose "
                         "another --out")
    if saved is None and folder.runs_dir.exists():  # run folders of no study: never adopted, even with --resume
        raise UsageError(f"{out} holds run folders but no {folder.plan_file.name}; choose another --out")
    if saved is None and resume:
        start = f": {command_without_resume(command)}" if command else ""
        raise UsageError(f"--resume: {out} holds no study ({folder.plan_file.name}) to continue; start one with the "
                         f"same command without --resume{start}")
    if saved is not None and saved.study != study.name:
        raise UsageError(f"--resume: {out} holds the study {saved.study}, not {study.name}")
    if saved is not None:
        parameters = {**saved.parameters, **{k: v for k, v in (parameters or {}).items() if v is not None}}
        tensorboard_out = saved.tensorboard_out if tensorboard_out is None else tensorboard_out
    try:
        configs = study.configurations(**(parameters or {}))
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    varying = {key for options in configs.values() for key in options}
    varied = sorted(varying & set(explicit))
    if varied:
        raise UsageError(f"study {study.name} varies {', '.join(map(option_flag, varied))}: it cannot be set for the "
                         "whole study (register a study of your own to vary something else)")
    if saved is None:
        options = dict(given)
        options.update({k: v for k, v in study.options.items() if k not in explicit})
    else:
        options = resumed_options(given, explicit, dict(saved.options), log=log, may_change=may_change,
                                  what="study")
    # what the configurations set, and the epochs (the plan's own entry), are not shared options
    options = {k: v for k, v in options.items() if k not in varying and k != "epochs"}
    seeds = list(seeds) if seeds is not None else (list(saved.seeds) if saved else list(range(study.seeds)))
    epochs = epochs or (saved.epochs if saved else study.epochs)
    seeds = [int(s) for s in seeds]
    return StudyPlan(
        study=study.name, varies=study.varies,
        command=_kept(saved.command, command) if saved else command,
        version=_kept(saved.version, tc.__version__) if saved else tc.__version__,  # the one it began with
        epochs=int(epochs), seeds=seeds,
        parameters={**study.parameters, **{k: v for k, v in (parameters or {}).items() if v is not None}},
        options=options,
        configs=[PlannedConfig(config_id, config_options,
                               [PlannedRun(config_id, s, StudyFolder.run_path(config_id, s)) for s in seeds])
                 for config_id, config_options in configs.items()],
        tensorboard_out=None if tensorboard_out is None else str(tensorboard_out))


def _kept(saved, new):
    """A saved plan's ``saved`` field, where it has one, else ``new``."""
    return new if saved is None else saved
