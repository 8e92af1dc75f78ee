"""Which training options a command line gave, and how ``train --resume`` combines them with the run's own.

``--resume --out DIR`` continues the run as it was configured: every option the command line does
not give is taken from the run's ``config.json`` (the options it was started with), so
``--resume --out DIR`` alone is enough. An option given again with the run's value is fine; one
given with another value is refused in one line naming it and both values, except the options in
``MAY_CHANGE_ON_RESUME``, which change where and how long the run goes on, not what it computes:
``--epochs`` (extend or shorten the run), ``--device``, ``--data-dir`` (the same data, elsewhere),
``--log-gradflow``, ``--log-mode-cosine``, ``--tensorboard`` and ``--cuda-graph`` (a captured step
computes exactly what the eager one does).
Their new values are written to ``config.json``, and the change is printed.
``--distributed`` and ``--sync-batchnorm`` describe the launch and are taken from the command line.

Options that only a CapsNet has are refused with ``--model cnn`` (``capsule_only_options``), and
the CNN's own options with a CapsNet (``commands.train.model_options``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import UsageError

MAY_CHANGE_ON_RESUME = ("epochs", "device", "data_dir", "log_gradflow", "log_mode_cosine", "cuda_graph",
                        "tensorboard")
LAUNCH_OPTIONS = ("distributed", "sync_batchnorm")
NOT_RUN_OPTIONS = ("command", "out", "resume", "no_progress", "profile", "debug", "explicit", "command_line")
# The CapsNet's options (the model options) and the training options that only a CapsNet uses.
CAPSULE_TRAINING_OPTIONS = ("reconstruction_weight", "log_gradflow", "log_mode_cosine")

_UNSET = object()


def explicit_options(parser, argv) -> set:
    """The destinations (``"conv1_channels"``, ...) of the options that ``argv`` gives explicitly.

    ``parser`` is parsed a second time with every default replaced by a marker, so abbreviations
    (``--epoch``), ``--opt=value`` and presets' defaults are all told apart correctly.
    """
    saved = []
    for action in _all_actions(parser):
        saved.append((action, action.default))
        action.default = _UNSET
    try:
        parsed = parser.parse_args(argv)
    finally:
        for action, default in saved:
            action.default = default
    return {name for name, value in vars(parsed).items() if value is not _UNSET}


def _all_actions(parser):
    """Every option action of ``parser`` and of its subcommands' parsers."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_actions(sub)
        elif action.dest != "help":
            yield action


def option_flag(name: str) -> str:
    """``"conv1_channels"`` -> ``"--conv1-channels"``."""
    return "--" + name.replace("_", "-")


def saved_run_options(out: Path):
    """The options a run in ``out`` was started with (its ``config.json``), or None if it has none yet.

    A ``config.json`` that cannot be read as a JSON object is a one-line UsageError.
    """
    path = Path(out) / "config.json"
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


def resumed_options(given: dict, explicit: set, saved: dict, log=None) -> dict:
    """The options a resumed run trains with: ``saved`` (the run's own), with the options in
    ``explicit`` taken from ``given`` where they may change (``MAY_CHANGE_ON_RESUME``) or agree.

    Raises UsageError naming the first option given with a value the run cannot change.
    """
    log = log or print
    options = dict(given)
    for name, value in given.items():
        if name in NOT_RUN_OPTIONS or name in LAUNCH_OPTIONS or name not in saved:
            continue  # a new option since the run started keeps the command line's value
        if name == "image_size" and saved.get("dataset") != "imagefolder":
            continue  # config.json records the dataset's own image size; the option resizes image folders only
        if name not in explicit:
            options[name] = saved[name]
        elif _normalized(value) != _normalized(saved[name]):
            if name not in MAY_CHANGE_ON_RESUME:
                raise UsageError(f"--resume: {option_flag(name)} {_shown(value)} differs from the run's "
                                 f"{_shown(saved[name])}; a run continues as it was configured (only "
                                 f"{', '.join(map(option_flag, MAY_CHANGE_ON_RESUME))} may change): drop the "
                                 f"option or start a new run with another --out")
            log(f"--resume: {option_flag(name)} changes from {_shown(saved[name])} to {_shown(value)}")
    return options


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
