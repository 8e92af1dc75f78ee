"""The training options on the command line, derived from ``TrainingConfig``: one option per field
(``--epochs``, ``--lr``, ..., ``--tensorboard``), typed, bounded and explained by the field, beside
the model's options (derived from ``CapsNetConfig`` and ``BaselineCNNConfig``)."""
from __future__ import annotations

import argparse
import dataclasses

from tinygrad_caps.data import DATASETS

from ..training.config import MAY_CHANGE, RESTORED, TrainingConfig, checked
from ..training.run_options import option_flag
from .model_options import add_cnn_options, add_model_options

# Options whose help names what is known only at run time (the registered datasets).
HELP_NOW = {"dataset": lambda: f"{', '.join(DATASETS)}, or the name of a folder of IDX files under --data-dir"}


def argument_type(field: dataclasses.Field):
    """The argparse type of a field's option: the text parsed as the field's kind, then checked by it."""
    kind = field.metadata["kind"]

    def option_value(text):
        try:
            value = {"int": int, "real": float}.get(kind, str)(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {'an integer' if kind == 'int' else 'a number'}, "
                                             f"got {text!r}") from None
        try:
            return checked(field, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    option_value.__name__ = field.name  # argparse names the type in "invalid NAME value"
    return option_value


def add_option(parser, field: dataclasses.Field) -> None:
    """Add the option of ``field`` to ``parser``, with the field's default."""
    meta = field.metadata
    default = field.default
    help_text = HELP_NOW.get(field.name, lambda: meta["help"])()
    flag = option_flag(field.name)
    if meta["kind"] == "bool":
        action = parser.add_argument(flag, dest=field.name, action="store_true", default=default, help=help_text)
    elif meta.get("empty"):  # --tensorboard [DIR]: without DIR, the run folder's default
        action = parser.add_argument(flag, dest=field.name, nargs="?", const="", default=default,
                                     metavar=meta["metavar"], type=argument_type(field), help=help_text)
    elif meta["kind"] == "choice":
        action = parser.add_argument(flag, dest=field.name, choices=meta["choices"], default=default,
                                     help=help_text, type=type(meta["choices"][0]))
    else:
        action = parser.add_argument(flag, dest=field.name, type=argument_type(field), default=default,
                                     metavar=meta["metavar"], help=help_text)
    action.on_resume = MAY_CHANGE if meta["resume"] in (MAY_CHANGE, RESTORED) else meta["resume"]


def may_change_on_resume(parser) -> list:
    """The options of ``parser`` (a command's) that its ``--resume`` takes with another value: those
    marked ``on_resume = MAY_CHANGE`` where they are added (``mark_may_change``; a training option by
    its field's rule), in the parser's order."""
    return [next(flag for flag in action.option_strings if flag.startswith("--")) for action in parser._actions
            if getattr(action, "on_resume", None) == MAY_CHANGE]


def mark_may_change(*actions) -> None:
    """Mark parser ``actions`` (what ``add_argument`` returned) as options that ``--resume`` takes with
    another value (``may_change_on_resume`` lists them)."""
    for action in actions:
        action.on_resume = MAY_CHANGE


def add_training_options(parser, names=None) -> None:
    """Add the training options ``names`` (default: every field of ``TrainingConfig``) to ``parser``,
    with the model options (CapsNet's with their defaults, the CNN's unset) after ``--reconstruction-weight``."""
    for field in TrainingConfig.option_fields():
        if names is not None and field.name not in names:
            continue
        add_option(parser, field)
        if field.name == "reconstruction_weight":
            add_model_options(parser, defaults=True)
            add_cnn_options(parser)


def _values_text(field: dataclasses.Field) -> str:
    """What a field allows, as the options table writes it."""
    from ..training.config import range_text

    meta = field.metadata
    text = {"bool": "a switch", "text": "a name or path"}.get(meta["kind"])
    if meta["kind"] == "choice":
        text = ", ".join(f"`{choice}`" for choice in meta["choices"])
    elif meta["kind"] in ("int", "real"):
        text = ("an integer " if meta["kind"] == "int" else "") + range_text(meta)
    return text + (", or unset" if meta["optional"] else "")


def options_table_markdown() -> str:
    """docs/training.md's table of the training options: option, TrainingConfig field, default,
    values, what ``--resume`` does with another value, and what it does."""
    lines = ["| option | `TrainingConfig` field | default | values | on `--resume` | what it does |",
             "| --- | --- | --- | --- | --- | --- |"]
    for field in TrainingConfig.option_fields():
        meta = field.metadata
        default = "unset" if field.default is None else f"`{field.default}`"
        resume = {"may change": "may change", "launch": "the command line's", "fixed": "refused",
                  "restored": "may change (a warning: the last bits differ)"}[meta["resume"]]
        only = " (CapsNet only)" if meta["capsnet_only"] else ""
        lines.append(f"| `{option_flag(field.name)}` | `{field.name}` | {default} | {_values_text(field)} | {resume} | "
                     f"{meta['help']}{only} |")
    return "\n".join(lines) + "\n"
