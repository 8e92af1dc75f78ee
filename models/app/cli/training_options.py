"""The training options on the command line, derived from ``TrainingConfig`` by the one option
facility (``tinygrad_caps.models.options``): one option per field (``--epochs``, ``--lr``, ...,
``--tensorboard``), typed, bounded and explained by the field's declaration, beside the model's
options (derived from ``CapsNetConfig`` and ``BaselineCNNConfig``); docs/training.md's table; and
the one ``TrainingConfig`` of a parsed ``train`` command line (``training_config_from_args``)."""
from __future__ import annotations

from tinygrad_caps.data import DATASETS

from ...options import add_options, options_table
from ..training.config import MAY_CHANGE, RESTORED, TrainingConfig
from ..training.run_options import CommandLineOptions
from .model_options import add_cnn_options, add_model_options

# Options whose help names what is known only at run time (the registered datasets).
HELP_NOW = {"dataset": lambda: f"{', '.join(DATASETS)}, or the name of a folder of IDX files under --data-dir"}
RESUME_TEXTS = {MAY_CHANGE: "may change", "launch": "the command line's", "fixed": "refused",
                RESTORED: "may change (a warning: the last bits differ)"}


def may_change_on_resume(parser) -> list:
    """The options of ``parser`` (a command's) that its ``--resume`` takes with another value: those
    marked so where they are added (``mark_may_change``; a training option by its field's ``resume``
    tag, "may change" or "restored"), in the parser's order."""
    return [next(flag for flag in action.option_strings if flag.startswith("--")) for action in parser._actions
            if getattr(action, "on_resume", None) in (MAY_CHANGE, RESTORED)]


def mark_may_change(*actions) -> None:
    """Mark parser ``actions`` (what ``add_argument`` returned) as options that ``--resume`` takes with
    another value (``may_change_on_resume`` lists them)."""
    for action in actions:
        action.on_resume = MAY_CHANGE


def add_training_options(parser, names=None) -> None:
    """Add the training options ``names`` (default: every field of ``TrainingConfig``) to ``parser``,
    with the model options (CapsNet's with their defaults, the CNN's unset) after ``--reconstruction-weight``."""
    names = [f.name for f in TrainingConfig.option_fields() if names is None or f.name in names]
    split = names.index("reconstruction_weight") + 1 if "reconstruction_weight" in names else len(names)
    add_options(parser, TrainingConfig, names=names[:split], help_now=HELP_NOW)
    if "reconstruction_weight" in names:
        add_model_options(parser, defaults=True)
        add_cnn_options(parser)
    add_options(parser, TrainingConfig, names=names[split:], help_now=HELP_NOW)


def training_config_from_args(args, saved=None, *, may_change=None, log=print) -> tuple:
    """(the run's one TrainingConfig, the destinations the command line set) of a parsed ``train``
    command line: its values (the preset's where it gave none), with ``saved`` (the run's config.json
    on ``--resume``) merged by the resume rules, and only the chosen model's options (UsageError for
    the other model's, given explicitly)."""
    given = CommandLineOptions.of(args)
    if saved is not None:
        given = given.resumed(saved, may_change=may_change, log=log)
    return given.training_config(), given.explicit


def options_table_markdown() -> str:
    """docs/training.md's table of the training options: option, TrainingConfig field, default,
    values, what ``--resume`` does with another value, and what it does."""
    def resume(option) -> str:
        return RESUME_TEXTS[option.tags["resume"]]

    def described(option) -> str:
        return option.help_text() + (" (CapsNet only)" if option.tags["capsnet_only"] else "")

    return options_table(TrainingConfig, columns=[("on `--resume`", resume)], describe=described)
