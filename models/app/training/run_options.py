"""The run options a command line gave (``CommandLineOptions``: built once from the parsed arguments
into the run's one TrainingConfig), and how ``train --resume`` combines them with the run's own.

``--resume --out DIR`` continues the run as it was configured: every option the command line does
not give is taken from the run's ``config.json`` (the options it was started with), so
``--resume --out DIR`` alone is enough. An option given again with the run's value is fine; one
given with another value follows its field's ``resume`` tag in ``TrainingConfig``: "may change"
(``MAY_CHANGE_ON_RESUME``: where and how long the run goes on, not what it computes) is taken and
printed, "restored" (``RESTORED_ON_RESUME``: ``--threads``) is taken and the Trainer warns that the
results then differ in their last bits, "launch" (``LAUNCH_OPTIONS``: ``--distributed``,
``--sync-batchnorm``) is always the command line's, and "fixed" is refused in one line naming it
and both values. The new values are written to ``config.json``.

Options that only a CapsNet has are refused with ``--model cnn`` (``capsule_only_options``), and
the CNN's own options with a CapsNet (``model_options``).
"""
from __future__ import annotations

import dataclasses
import json
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ...capsnet.config import CNN_OPTIONS, MODEL_OPTIONS, CapsNetConfig
from ...errors import UsageError
from ...options import option_flag
from .config import (CAPSULE_TRAINING_OPTIONS, LAUNCH_OPTIONS, MAY_CHANGE_ON_RESUME,  # derived from TrainingConfig
                     RESTORED_ON_RESUME, TrainingConfig, training_config)
from .run_folder import RunFolder

# what a command line holds beside a run's options (never written to config.json)
NOT_RUN_OPTIONS = ("command", "out", "resume", "resume_or_start", "no_progress", "profile", "debug", "explicit",
                   "command_line")


@dataclass(frozen=True)
class CommandLineOptions:
    """The run options one parsed command line holds: ``values``, every option's value by destination
    (its default or the preset's where the command line gave none; ``--augment none`` as config.json
    stores it, null), and ``explicit``, the destinations the command line gave itself."""

    values: Mapping
    explicit: frozenset

    @classmethod
    def of(cls, args) -> "CommandLineOptions":
        """The run options of parsed ``args`` (``args.explicit``: what the command line gave)."""
        values = {k: v for k, v in vars(args).items() if k not in NOT_RUN_OPTIONS}
        if values.get("augment") == "none":
            values["augment"] = None
        return cls(types.MappingProxyType(values), frozenset(getattr(args, "explicit", ())))

    def resumed(self, saved: dict, *, may_change=None, what: str = "run", log=print) -> "CommandLineOptions":
        """These options on ``--resume`` of a run started with ``saved`` (``resumed_options``' rules)."""
        values = resumed_options(dict(self.values), self.explicit, saved, log=log, may_change=may_change, what=what)
        return dataclasses.replace(self, values=types.MappingProxyType(values))

    def training_config(self) -> TrainingConfig:
        """The run's TrainingConfig: these options with only the chosen model's (``model_options``:
        UsageError for the other model's, given explicitly; one for a bad option, naming its flag)."""
        return training_config(model_options(dict(self.values), self.explicit))


def saved_run_options(out: Path):
    """The options a run in ``out`` was started with (its ``config.json``), or None if it has none yet.

    A ``config.json`` that cannot be read as a JSON object is a one-line UsageError.
    """
    path = RunFolder(out).config
    return read_json_object(path, f"--resume: cannot read the run's options from {path}",
                            f"--resume: {path} does not hold the run's options (a JSON object)")


def read_json_object(path: Path, unreadable: str, not_an_object: str):
    """The JSON object in ``path``, or None where there is no such file; a UsageError saying
    ``unreadable`` (with the reason) or ``not_an_object`` where it cannot be read as one."""
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{unreadable} ({exc})") from None
    if not isinstance(saved, dict):
        raise UsageError(not_an_object)
    return saved


def resumed_options(given: dict, explicit: set, saved: dict, log=None, may_change=None, what: str = "run") -> dict:
    """The options a resumed run trains with: ``saved`` (the run's own), with the options in
    ``explicit`` taken from ``given`` where they may change (``MAY_CHANGE_ON_RESUME``, and
    ``RESTORED_ON_RESUME``, whose change the Trainer warns about) or agree.

    Raises UsageError naming the first option given with a value the run cannot change; its list of
    the options that may change is ``may_change`` (flags: the command's own, from its parser;
    default: ``train``'s), and ``what`` names what continues ("run", "study").
    """
    log = log or print
    options = dict(given)
    saved = {**capsnet_options_newer_than(saved), **saved}
    for name, value in given.items():
        if name in NOT_RUN_OPTIONS or name in LAUNCH_OPTIONS or name not in saved:
            continue  # a new option since the run started keeps the command line's value
        if name == "image_size" and saved.get("dataset") != "imagefolder":
            continue  # config.json records the dataset's own image size; the option resizes image folders only
        if name not in explicit:
            options[name] = saved[name]
        elif _normalized(value) != _normalized(saved[name]) and name not in RESTORED_ON_RESUME:
            if name not in MAY_CHANGE_ON_RESUME:
                listed = may_change if may_change is not None else train_may_change_on_resume()
                raise UsageError(f"--resume: {option_flag(name)} {_shown(value)} differs from the {what}'s "
                                 f"{_shown(saved[name])}; a {what} continues as it was configured (only "
                                 f"{', '.join(listed)} may change): drop the option or start a new {what} with "
                                 "another --out")
            log(f"--resume: {option_flag(name)} changes from {_shown(saved[name])} to {_shown(value)}")
    return options


def capsnet_options_newer_than(saved: Mapping) -> dict:
    """The CapsNet options a run's config ``saved`` lacks (options added since the run started), with
    the defaults the run's model was built with; {} for another model."""
    if saved.get("model", CapsNetConfig.MODEL) != CapsNetConfig.MODEL:
        return {}
    defaults = CapsNetConfig().to_dict()
    return {name: defaults[name] for name in MODEL_OPTIONS if name not in saved}


def train_may_change_on_resume() -> list:
    """The flags of the training options that ``train --resume`` takes with another value."""
    return [option_flag(name) for name in TrainingConfig.option_keys()
            if name in MAY_CHANGE_ON_RESUME or name in RESTORED_ON_RESUME]


def capsule_only_options(explicit: set, model_options) -> list:
    """The CapsNet-only options in ``explicit`` (model options and ``CAPSULE_TRAINING_OPTIONS``), as flags."""
    names = [n for n in (*model_options, *CAPSULE_TRAINING_OPTIONS) if n in explicit]
    return [option_flag(n) for n in names]


def _normalized(value):
    """JSON's view of a value (tuples become lists), so that a config.json value compares equal."""
    return json.loads(json.dumps(value))


def _shown(value) -> str:
    if isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
        return ",".join(f"{a}x{b}" for a, b in value) or "(none)"
    if isinstance(value, bool):
        return "on" if value else "off"
    return "(none)" if value is None else str(value)


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
