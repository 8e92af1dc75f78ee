"""The model's command-line options, derived from CapsNetConfig and BaselineCNNConfig by the one
option facility (``tinygrad_caps.models.options``): one option per model option field
(``--routing-iterations``, ..., ``--cnn-channels``), typed, bounded and explained by the field's
declaration, and the README's options tables (``options_table_markdown``).
"""
from __future__ import annotations

import argparse

from ...capsnet.config import BaselineCNNConfig, CapsNetConfig
from ...options import add_options, options_table


def positive_int(text):
    """argparse type of the commands' own counts (``--batch-size`` of evaluate, ``--profile``): an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def add_model_options(parser, defaults: bool) -> list:
    """Add CapsNet's options to ``parser``; with ``defaults=False`` each defaults to None (evaluate
    and visualize then take the checkpoint's value). Returns the argparse actions."""
    return add_options(parser, CapsNetConfig, defaults=defaults)


def add_cnn_options(parser) -> list:
    """Add the baseline CNN's options (``--cnn-channels``, ``--cnn-hidden``, ``--dropout``); each
    defaults to None, so a run records only what it sets (the CNN's defaults apply otherwise)."""
    return add_options(parser, BaselineCNNConfig, defaults=False)


def options_table_markdown(config_class=CapsNetConfig) -> str:
    """The README's table of ``config_class``'s options: CLI option, field (the keyword of the model's
    constructor), default, allowed values and what it does; the geometry fields come from the dataset."""
    return options_table(config_class)
