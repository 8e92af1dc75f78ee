"""``study run``: every configuration of a registered study with every seed, each an ordinary run
folder trained by the ``Trainer``, then the summary (``study_summary``).

Layout of the study folder DIR:

    DIR/study.json                          the plan: the study, the command, the package version,
                                            the options every run shares, the seeds, the epochs and,
                                            per configuration, its config_id, options and runs
    DIR/runs/<config_id>/seed-<seed>/       a run folder as ``train`` writes it (config.json,
                                            metrics.jsonl, checkpoints/, gradflow.jsonl if logged)
    DIR/runs/<config_id>/seed-<seed>/train.log, run.lock, failed.json   (``run_task``)
    DIR/summary.json, summary.md, summary.png
    DIR/study.lock                          while a ``study run`` drives the folder (``study_lock``)
    DIR/study.stop, study.token             while a stopped study's runs save; the Ray executor's token

Where the runs train is the placement's (``placement.py``): one at a time in this process
(``train_runs``, the default), or handed to an executor by ``driver.drive_runs``; every run is
trained by ``run_task.train_study_run`` either way.

Before anything is written, every configuration's first run is checked as ``train`` checks a run
(``check_plan_runs``: its Trainer is built, untrained), and the folder is refused where it lies in a
training run's folder or in another study's runs/. ``--resume`` of a folder without a study is refused
(``--resume-or-start`` starts one there, and continues one where it finds it).

``--resume`` takes the options the study was started with (those the command line does not give;
an option that changes what a run computes is refused, as in ``train --resume``), skips the runs
that have finished and continues the interrupted ones from their ``last.npz`` with ``train``'s
guarantee (the same metrics as a run never interrupted). A study run again over finished runs
rewrites nothing. ``--max-minutes`` stops at the first batch boundary after the time, saves the
run, writes the summary of what has finished, and exits with status 75 (EX_TEMPFAIL: run the
printed command, or the same with ``--resume-or-start``, to continue); every call trains at least
one batch first, so a loop of calls ends however short the limit. ``--tensorboard-out`` is kept in the plan and honoured on resume.
"""
from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import time
from pathlib import Path

import tinygrad_caps as tc

from ...errors import UsageError
from ..training.reporting import is_user_error, one_line
from ..training.option_checks import check_out_folder, device_or_usage_error
from ..training.run_options import option_flag, resumed_options
from ..training.run_folder import RunFolder
from ..training.run_state import Interrupted, write_text_atomically
from .placement import SCHEDULING_OPTIONS
from .plan_file import load_plan
from .registry import Study
from .run_task import STUDY_FILE, run_config, run_path, run_status, train_study_run

EXIT_TIME_LIMIT = 75  # EX_TEMPFAIL: stopped by --max-minutes, continue with --resume
# study run's own options; every other destination of its parser is a training option shared by the runs
STUDY_ONLY = ("command", "study_command", "name", "out", "seeds", "seed_list", "max_minutes", "resume",
              "resume_or_start", "max_depth",
              "debug", "explicit", "no_progress", "command_line", "tensorboard_out", *SCHEDULING_OPTIONS)


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` atomically unless it already holds exactly that; True if written."""
    if path.exists() and path.read_text() == text:
        return False
    write_text_atomically(path, text)
    return True


def read_study(out) -> dict | None:
    """DIR/study.json, or None where there is none; UsageError naming the file and the field where it
    cannot be read as a study's plan (``study_file.load_plan``, the one loader of resume and summary)."""
    return load_plan(Path(out) / STUDY_FILE)


def is_train_run_folder(folder: Path) -> bool:
    """Whether ``folder`` is the run folder of a training run: its config.json beside its
    metrics.jsonl or checkpoints/ (what ``train`` writes once its first batch has trained)."""
    return RunFolder(folder).holds_a_run()


def check_not_in_a_run_folder(out) -> None:
    """UsageError where ``out`` is, or lies inside, the run folder of a training run, or lies inside
    the run folders (runs/) of a study: a study there would mix its files with theirs."""
    out = Path(out)
    try:
        target = out.resolve()
    except (OSError, RuntimeError):  # a loop of links: check_out_folder has spoken where that matters
        target = out.absolute()
    for folder in (target, *target.parents):
        if is_train_run_folder(folder):
            where = "is" if folder == target else f"lies inside {folder}, which is"
            raise UsageError(f"--out {out} {where} the run folder of a training run (config.json, checkpoints/); "
                             "a study needs a folder of its own: choose another --out")
        if folder != target and (folder / STUDY_FILE).is_file() and (folder / "runs") in (target, *target.parents):
            raise UsageError(f"--out {out} lies inside the run folders of the study in {folder} ({folder / 'runs'}); "
                             "a study needs a folder of its own: choose another --out")


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
               resume=False, command="", log=print, tensorboard_out=None, may_change=None) -> dict:
    """The study's plan (what DIR/study.json holds), from the command line's training options
    ``given`` (all of them, defaults included; ``explicit`` those it set) and, with ``resume``, the
    saved plan. Raises UsageError for an option the study varies, a folder inside a training run's
    or another study's run folders, a folder that holds a study without ``resume`` or (with
    ``resume``) none, another study or a changed option (its message lists ``may_change``: the flags
    of ``study run`` that may change). ``tensorboard_out`` (else, on resume, the saved one) is kept
    in the plan, so a continued study exports its runs too."""
    out = Path(out)
    check_out_folder(out, resume)
    check_not_in_a_run_folder(out)
    saved = read_study(out)
    if saved is not None and not resume:
        raise UsageError(f"{out} holds a study already ({saved['study']}); pass --resume to continue it or choose "
                         "another --out")
    if saved is None and (out / "runs").exists():  # run folders of no study: never adopted, even with --resume
        raise UsageError(f"{out} holds run folders but no {STUDY_FILE}; choose another --out")
    if saved is None and resume:
        start = f": {command_without_resume(command)}" if command else ""
        raise UsageError(f"--resume: {out} holds no study ({STUDY_FILE}) to continue; start one with the same command "
                         f"without --resume{start}")
    if saved is not None and saved["study"] != study.name:
        raise UsageError(f"--resume: {out} holds the study {saved['study']}, not {study.name}")
    if saved is not None:
        parameters = {**saved.get("parameters", {}), **{k: v for k, v in (parameters or {}).items() if v is not None}}
        tensorboard_out = saved.get("tensorboard_out") if tensorboard_out is None else tensorboard_out
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
        options = resumed_options(given, explicit, saved["options"], log=log, may_change=may_change, what="study")
    # what the configurations set, and the epochs (the plan's own entry), are not shared options
    options = {k: v for k, v in options.items() if k not in varying and k != "epochs"}
    seeds = list(seeds) if seeds is not None else (saved["seeds"] if saved else list(range(study.seeds)))
    epochs = epochs or (saved["epochs"] if saved else study.epochs)
    plan = {"study": study.name, "varies": study.varies,
            "command": saved.get("command", command) if saved else command,
            "version": saved.get("version", tc.__version__) if saved else tc.__version__,  # the one it began with
            "epochs": int(epochs), "seeds": [int(s) for s in seeds],
            "parameters": {**study.parameters, **{k: v for k, v in (parameters or {}).items() if v is not None}},
            "options": options,
            "configs": [{"config_id": config_id, "options": config_options,
                         "runs": [{"seed": s, "path": run_path(config_id, s)} for s in seeds]}
                        for config_id, config_options in configs.items()]}
    if tensorboard_out is not None:  # (absent otherwise: an older study's study.json keeps its bytes)
        plan["tensorboard_out"] = str(tensorboard_out)
    return plan


def check_plan_runs(plan: dict, out, log=None) -> None:
    """Apply every check ``train`` applies before it writes anything to the first run of every
    configuration of ``plan``, before the study writes anything: each run's ``Trainer`` is built
    (its data loaded, its model built, its options checked) and dropped, untrained. A refusal is a
    UsageError naming the configuration."""
    from ..training.trainer import Trainer  # the trainer (and the dataset code) only when a study is run

    out = Path(out)
    for config in plan["configs"]:
        run = config["runs"][0]
        try:
            options = run_config(plan, config, run["seed"])
            with tc.backend.on_device(device_or_usage_error(options.get("device", "auto"))):
                Trainer(options, out / run["path"], resume=False, show_progress=False, log=log or _silent)
        except Exception as exc:  # noqa: BLE001  (a user's mistake gets the configuration's name; a bug passes)
            if not is_user_error(exc):
                raise
            raise UsageError(f"configuration {config['config_id']}: {one_line(exc)}") from exc


def _silent(text: str) -> None:
    """A log that says nothing (the checks' Trainers speak only where they refuse)."""


def write_plan(out: Path, plan: dict) -> None:
    """Write ``plan`` to DIR/study.json (creating DIR) unless it holds exactly that already."""
    out.mkdir(parents=True, exist_ok=True)
    write_if_changed(out / STUDY_FILE, json.dumps(plan, indent=2) + "\n")


def train_runs(plan: dict, out, deadline=None, show_progress=False, log=print, resume_command=None) -> dict:
    """Train every run of ``plan`` that has not finished, in order (configurations, then seeds), in
    this process; each run's lines go to ``log`` (prefixed with the run) and to its RUN/train.log.

    Returns {"finished": runs finished (before or now), "total": runs planned, "stopped": True if
    ``deadline`` (a time.monotonic() value) stopped the study, "failed": the outcomes of the runs that
    failed (the others go on)}. Ctrl-C saves the current run and raises Interrupted after saying how
    to continue (``resume_command``, default ``continue_command(plan, out)``)."""
    out = Path(out)
    total = sum(len(config["runs"]) for config in plan["configs"])
    finished, trained, failed = 0, False, []
    for config in plan["configs"]:
        for run in config["runs"]:
            run_dir = out / run["path"]
            status = run_status(run_dir, plan["epochs"])
            if status == "finished":
                finished += 1
                continue
            if trained and deadline is not None and time.monotonic() >= deadline:  # (the first run trains a batch)
                return {"finished": finished, "total": total, "stopped": True, "failed": failed}
            trained = True
            prefix = f"[{config['config_id']} seed {run['seed']}]"
            log(f"{prefix} {'continuing' if status == 'started' else 'training'} {run_dir}")
            with run_log(run_dir, lambda text: log(f"{prefix} {text}")) as both:
                outcome = train_study_run(out, config["config_id"], run["seed"], deadline=deadline, log=both,
                                          show_progress=show_progress)
            if outcome["status"] == "finished":
                finished += 1
            elif outcome["status"] == "stopped":
                return {"finished": finished, "total": total, "stopped": True, "failed": failed}
            elif outcome["status"] == "interrupted":
                print(f"study stopped; continue it with: {resume_command or continue_command(plan, out)}",
                      file=sys.stderr)
                raise Interrupted(outcome.get("signum", signal.SIGINT))
            else:
                log(f"{prefix} failed: {outcome['error']}")
                failed.append(outcome)
    return {"finished": finished, "total": total, "stopped": False, "failed": failed}


@contextlib.contextmanager
def run_log(run_dir: Path, terminal):
    """A log that writes each line to ``terminal`` and appends it to RUN/train.log (created with the folder)."""
    path = RunFolder(run_dir).train_log
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as file:
        def both(text: str) -> None:
            terminal(text)
            file.write(f"{text}\n")
            file.flush()

        yield both


def continue_command(plan: dict, out, scheduling=()) -> str:
    """The command that continues the study in ``out``: its --tensorboard-out and the words of the
    scheduling options it was started with (``scheduling``: ``["--jobs", "2", ...]``) repeated, so
    that every run continues with the thread count it started with."""
    words = ["tinygrad-caps", "study", "run", plan["study"], "--out", str(out), "--resume"]
    if plan.get("tensorboard_out") is not None:
        words += ["--tensorboard-out", plan["tensorboard_out"]]
    return shlex.join([*words, *scheduling])
