"""``study run``: every configuration of a registered study with every seed, each an ordinary run
folder trained by the ``Trainer``, then the summary (``study_summary``).

Layout of the study folder DIR:

    DIR/study.json                          the plan: the study, the command, the package version,
                                            the options every run shares, the seeds, the epochs and,
                                            per configuration, its config_id, options and runs
    DIR/runs/<config_id>/seed-<seed>/       a run folder as ``train`` writes it (config.json,
                                            metrics.jsonl, checkpoints/, gradflow.jsonl if logged)
    DIR/summary.json, summary.md, summary.png

``--resume`` takes the options the study was started with (those the command line does not give;
an option that changes what a run computes is refused, as in ``train --resume``), skips the runs
that have finished and continues the interrupted ones from their ``last.npz`` with ``train``'s
guarantee (the same metrics as a run never interrupted). A study run again over finished runs
rewrites nothing. ``--max-minutes`` stops at the first batch boundary after the time, saves the
run, writes the summary of what has finished, and exits with status 75 (EX_TEMPFAIL: run the same
command with ``--resume`` to continue).
"""
from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import tinygrad_caps as tc

from ..errors import UsageError
from .commands.train import model_options
from .option_checks import check_out_folder, device_or_usage_error
from .run_options import option_flag, read_json_object, resumed_options
from .run_state import Interrupted, TimeLimitReached, write_text_atomically
from .study_registry import Study

STUDY_FILE = "study.json"
EXIT_TIME_LIMIT = 75  # EX_TEMPFAIL: stopped by --max-minutes, continue with --resume
# study run's own options; every other destination of its parser is a training option shared by the runs
STUDY_ONLY = ("command", "study_command", "name", "out", "seeds", "seed_list", "max_minutes", "resume", "max_depth",
              "debug", "explicit", "no_progress", "command_line", "tensorboard_out")


def run_folder(config_id: str, seed: int) -> str:
    """A run's folder, relative to the study's: ``runs/<config_id>/seed-<seed>``."""
    return f"runs/{config_id}/seed-{seed}"


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` atomically unless it already holds exactly that; True if written."""
    if path.exists() and path.read_text() == text:
        return False
    write_text_atomically(path, text)
    return True


def read_study(out) -> dict | None:
    """DIR/study.json, or None where there is none; UsageError if it cannot be read as a study."""
    path = Path(out) / STUDY_FILE
    plan_keys = "a study's plan (study, options, seeds, epochs, configs)"
    saved = read_json_object(path, f"cannot read {path}", f"{path} is not {plan_keys}")
    if saved is not None and not {"study", "options", "seeds", "epochs", "configs"} <= set(saved):
        raise UsageError(f"{path} is not {plan_keys}")
    return saved


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
               resume=False, command="", log=print) -> dict:
    """The study's plan (what DIR/study.json holds), from the command line's training options
    ``given`` (all of them, defaults included; ``explicit`` those it set) and, with ``resume``, the
    saved plan. Raises UsageError for an option the study varies, a folder that holds a study
    without ``resume``, or (with ``resume``) another study or a changed option."""
    out = Path(out)
    check_out_folder(out, resume)
    saved = read_study(out)
    if saved is not None and not resume:
        raise UsageError(f"{out} holds a study already ({saved['study']}); pass --resume to continue it or choose "
                         "another --out")
    if saved is None and (out / "runs").exists():  # run folders of no study: never adopted, even with --resume
        raise UsageError(f"{out} holds run folders but no {STUDY_FILE}; choose another --out")
    if saved is not None and saved["study"] != study.name:
        raise UsageError(f"--resume: {out} holds the study {saved['study']}, not {study.name}")
    if saved is not None:
        parameters = {**saved.get("parameters", {}), **{k: v for k, v in (parameters or {}).items() if v is not None}}
    try:
        configs = study.configurations(**(parameters or {}))
    except ValueError as exc:
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
        options = resumed_options(given, explicit, saved["options"], log=log)
    # what the configurations set, and the epochs (the plan's own entry), are not shared options
    options = {k: v for k, v in options.items() if k not in varying and k != "epochs"}
    seeds = list(seeds) if seeds is not None else (saved["seeds"] if saved else list(range(study.seeds)))
    epochs = epochs or (saved["epochs"] if saved else study.epochs)
    return {"study": study.name, "varies": study.varies,
            "command": saved["command"] if saved else command,
            "version": saved.get("version", tc.__version__) if saved else tc.__version__,  # the one it began with
            "epochs": int(epochs), "seeds": [int(s) for s in seeds],
            "parameters": {**study.parameters, **{k: v for k, v in (parameters or {}).items() if v is not None}},
            "options": options,
            "configs": [{"config_id": config_id, "options": config_options,
                         "runs": [{"seed": s, "path": run_folder(config_id, s)} for s in seeds]}
                        for config_id, config_options in configs.items()]}


def run_config(plan: dict, config: dict, seed: int) -> dict:
    """The options one run trains with: the study's shared options, the configuration's own, the
    epochs and the seed, with only the chosen model's options (as ``train`` records them)."""
    options = {"model": "capsnet", **plan["options"]}  # a study may train another model for all its runs
    options.update(config["options"], epochs=plan["epochs"], seed=seed)
    if options.get("augment") == "none":
        options["augment"] = None
    return model_options(options, explicit=set())


def run_status(run_dir: Path, epochs: int) -> str:
    """"finished" (its checkpoint has committed ``epochs`` epochs or more: a run taken further by an
    earlier, longer plan is finished for a shorter one), "started" (a checkpoint to resume) or "new"."""
    last = run_dir / "checkpoints" / "last.npz"
    if not last.exists():
        return "new"
    return "finished" if tc.load(last)["progress"]["epoch"] >= epochs else "started"


def write_plan(out: Path, plan: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_if_changed(out / STUDY_FILE, json.dumps(plan, indent=2) + "\n")


def train_runs(plan: dict, out, deadline=None, show_progress=False, log=print) -> dict:
    """Train every run of ``plan`` that has not finished, in order (configurations, then seeds).

    Returns {"finished": runs finished (before or now), "total": runs planned, "stopped": True if
    ``deadline`` (a time.monotonic() value) stopped the study}. Ctrl-C saves the current run and
    raises Interrupted after saying how to continue."""
    out = Path(out)
    total = sum(len(config["runs"]) for config in plan["configs"])
    finished = 0
    for config in plan["configs"]:
        for run in config["runs"]:
            run_dir = out / run["path"]
            status = run_status(run_dir, plan["epochs"])
            if status == "finished":
                finished += 1
                continue
            if deadline is not None and time.monotonic() >= deadline:
                return {"finished": finished, "total": total, "stopped": True}
            prefix = f"[{config['config_id']} seed {run['seed']}]"
            log(f"{prefix} {'continuing' if status == 'started' else 'training'} {run_dir}")
            options = run_config(plan, config, run["seed"])
            try:
                _train_one(options, run_dir, status == "started", deadline, show_progress,
                           lambda text: log(f"{prefix} {text}"))
            except TimeLimitReached:
                return {"finished": finished, "total": total, "stopped": True}
            except Interrupted:
                print(f"study stopped; continue it with: {continue_command(plan, out)}", file=sys.stderr)
                raise
            finished += 1
    return {"finished": finished, "total": total, "stopped": False}


def _train_one(options, run_dir, resume, deadline, show_progress, log):
    from .training import Trainer  # the trainer (and the dataset code) only when a run trains

    with tc.backend.on_device(device_or_usage_error(options.get("device", "auto"))):
        trainer = Trainer(options, run_dir, resume=resume, show_progress=show_progress, log=log)
        trainer.deadline = deadline
        trainer.run()


def continue_command(plan: dict, out) -> str:
    """The command that continues the study in ``out``."""
    return f"tinygrad-caps study run {plan['study']} --out {shlex.quote(str(out))} --resume"
