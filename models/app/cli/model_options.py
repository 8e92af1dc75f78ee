"""The model's command-line options, derived from CapsNetConfig and BaselineCNNConfig: one option per
model option field (``--routing-iterations``, ..., ``--cnn-channels``), typed, bounded and explained
by the field, and the README's options table (``options_table_markdown``).
"""
from __future__ import annotations

import argparse
import dataclasses

from ...capsnet.config import BaselineCNNConfig, CapsNetConfig, checked_value, choices_of
from ..training.option_checks import integer, number
from ..training.run_options import option_flag

# Other spellings of an option on the command line.
ALIASES = {"leaky_routing": ("--none-of-the-above",)}
METAVARS = {"capsule_layers": "COUNTxDIM,...", "ints": "N,N,...", "schedule": "L|L1,L2,...|NAME"}


def positive_int(text):
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _argument_type(field: dataclasses.Field):
    """The argparse type of a field's option: the text parsed, then checked by the field."""
    meta = field.metadata
    if meta["kind"] == "int" and meta["high"] is None and meta["low"] == 1:
        return positive_int
    parse = {"int": integer, "float": number, "ints": lambda text: [integer(part) for part in text.split(",")],
             "capsule_layers": str, "schedule": lambda text: _schedule(text, meta["names"])}[meta["kind"]]

    def option_value(text):
        try:
            value = checked_value(field, parse(text))
        except ValueError as exc:
            message = str(exc)
            if meta["kind"] == "int" and message.startswith("must be an integer "):  # the range, as "in [1, 100]"
                message = f"must lie in [{meta['low']}, {meta['high']}], got {text}"
            raise argparse.ArgumentTypeError(message) from None
        if meta["kind"] == "capsule_layers":
            return [list(pair) for pair in value]
        return list(value) if isinstance(value, tuple) else value

    option_value.__name__ = field.name  # argparse names the type in "invalid NAME value"
    return option_value


def _schedule(text: str, names: tuple):
    """A schedule option's text: one of ``names`` as it is, else one number or numbers separated by commas."""
    if text in names:
        return text
    parts = [number(part) for part in text.split(",")]
    return parts[0] if len(parts) == 1 else parts


def _add_options(parser, config_class, defaults: bool) -> None:
    for field in config_class.option_fields():
        key = config_class.key(field)
        meta = field.metadata
        default = config_class().to_dict()[key] if defaults else None
        flags = (option_flag(key), *ALIASES.get(key, ()))
        if meta["kind"] == "bool":
            parser.add_argument(*flags, dest=key, action="store_true", default=default, help=meta["help"])
        elif meta["kind"] == "choice":
            parser.add_argument(*flags, dest=key, choices=choices_of(meta), default=default, help=meta["help"])
        else:
            parser.add_argument(*flags, dest=key, type=_argument_type(field), default=default,
                                metavar=METAVARS.get(meta["kind"]), help=meta["help"])


def add_model_options(parser, defaults: bool) -> None:
    """Add CapsNet's options to ``parser``; with ``defaults=False`` each defaults to None (evaluate
    and visualize then take the checkpoint's value)."""
    _add_options(parser, CapsNetConfig, defaults)


def add_cnn_options(parser) -> None:
    """Add the baseline CNN's options (``--cnn-channels``, ``--cnn-hidden``, ``--dropout``); each
    defaults to None, so a run records only what it sets (the CNN's defaults apply otherwise)."""
    _add_options(parser, BaselineCNNConfig, defaults=False)


def _values_text(field: dataclasses.Field) -> str:
    meta = field.metadata
    kind = meta["kind"]
    if kind == "int":
        return f"{meta['low']} or more" if meta["high"] is None else f"{meta['low']} to {meta['high']}"
    if kind == "float":
        return f"[{meta['low']:g}, {meta['high']:g})"
    if kind == "choice":
        return ", ".join(f"`{choice}`" for choice in meta.get("listed") or choices_of(meta))
    if kind == "bool":
        return "a switch"
    if kind == "ints":
        return f"{meta['length']} positive integers, e.g. `{','.join(map(str, field.default))}`"
    if kind == "schedule":
        names = ", ".join(f"`{name}`" for name in meta["names"])
        return f"a number in [{meta['low']:g}, {meta['high']:g}), one per iteration (`L1,L2,...`), {names}"
    return "COUNTxDIM pairs, e.g. `32x12,32x12`"


def options_table_markdown(config_class=CapsNetConfig) -> str:
    """The README's table of ``config_class``'s options: CLI option, field (the keyword of the model's
    constructor), default, allowed values and what it does; the geometry fields come from the dataset."""
    lines = [f"| option | `{config_class.__name__}` field | default | values | what it does |",
             "| --- | --- | --- | --- | --- |"]
    for field in dataclasses.fields(config_class):
        meta = field.metadata
        key = config_class.key(field)
        option = "(the dataset)" if meta["geometry"] else ", ".join(
            f"`{flag}`" for flag in (option_flag(key), *ALIASES.get(key, ())))
        default = f'"{field.default}"' if isinstance(field.default, str) else repr(field.default)
        lines.append(f"| {option} | `{field.name}` | `{default}` | {_values_text(field)} | {meta['help']} |")
    return "\n".join(lines) + "\n"
