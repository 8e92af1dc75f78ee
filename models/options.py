"""One option facility for every config of the models: a field declared once with ``option(...)``
(its kind, the range its numbers lie in, with open or closed ends, its choices, its help) gives the
config's check of a value, its command-line option (``add_options``, ``argument_type``), its row of a
docs table (``options_table``) and the range its help text states (``Option.help_text``).

    lr: float = option(1e-3, REAL, "Adam's learning rate, {range}", range=Range(0, 1, low_open=True))

``CapsNetConfig``, ``BaselineCNNConfig`` and ``TrainingConfig`` are ``OptionsConfig`` dataclasses
declared this way: frozen, checked field by field when built (an ``OptionError`` naming the field),
``replace(**changes)`` for a checked copy, and read as the mapping of their JSON form
(``config["decoder"]``, ``dict(config)``). Free-form tags (``resume=``, ``geometry=``, ...) travel with a
declaration for the code that reads them; a config class gives their defaults in ``TAGS``.

Every check says why in one wording: "must be a positive integer, got 0", "must lie in (0, 1], got
2.0", "must be an integer, got 'x'", "must be a finite number, got float inf", "must be one of a, b,
got str 'c'". Imports no other module of the models.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
import types
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

OPTION = "option"  # the key of a field's metadata that holds its Option


class OptionError(ValueError):
    """A bad option value: ``field`` names the option, ``reason`` says what is wrong."""

    def __init__(self, owner: str, field: str, reason: str):
        super().__init__(f"{owner}: {field} {reason}")
        self.field, self.reason = field, reason


class UnknownOptionError(ValueError, TypeError):
    """A keyword that names no option of the config."""


def shown(value) -> str:
    """A value as a check's message names it: its type, and its repr where that is short."""
    text = repr(value)
    return type(value).__name__ + (f" {text}" if len(text) < 40 else "")


def is_integer(value) -> bool:
    """An int (NumPy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def json_form(value):
    """A value as config.json and checkpoints store it (tuples as lists, nested too)."""
    return [json_form(v) for v in value] if isinstance(value, (tuple, list)) else value


@dataclass(frozen=True)
class Range:
    """Where a number may lie: ``low`` and ``high`` (None: unbounded), each end closed unless open;
    ``high_text`` writes ``high`` in texts ("2**63 - 1")."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    high_text: str | None = None

    def __contains__(self, value) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def text(self) -> str:
        """The range as help, errors and docs write it: "in (0, 1]", ">= 1", "> 0", "in [0, 2**63 - 1]"."""
        high = self.high_text or (None if self.high is None else f"{self.high:g}")
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {high}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {high}{')' if self.high_open else ']'}"


POSITIVE = Range(1)  # an integer option's usual range, said "must be a positive integer"


@dataclass(frozen=True)
class Kind:
    """How a kind of option's command-line text is parsed (``parse``: text -> value, ValueError
    saying why not), its value checked (``check(option, value)`` -> the field's form, ValueError) and
    its allowed values described in docs tables (``describe(option)``); ``metavar``: the text's form."""

    name: str
    parse: Callable
    check: Callable
    describe: Callable
    metavar: str | None = None


def _parse_int(text) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"must be an integer, got {text!r}") from None


def _parse_real(text) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"must be a number, got {text!r}") from None


def _out_of_range(option, value):
    """The ValueError of a number outside the option's range."""
    if option.range == POSITIVE and is_integer(value):
        return ValueError(f"must be a positive integer, got {value}")
    return ValueError(f"must lie {option.range.text()}, got {value}")


def _check_int(option, value) -> int:
    if not is_integer(value):
        raise ValueError(f"must be an integer, got {shown(value)}")
    if option.range is not None and value not in option.range:
        raise _out_of_range(option, value)
    return int(value)


def _check_real(option, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {shown(value)}")
    if option.range is not None and value not in option.range:
        raise _out_of_range(option, value)
    return float(value)


def _check_bool(option, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"must be true or false, got {shown(value)}")
    return bool(value)


def _check_choice(option, value):
    choices = option.allowed()
    if isinstance(value, (bool, np.bool_)) or value not in choices:
        raise ValueError(f"must be one of {', '.join(map(str, choices))}, got {shown(value)}")
    return value


def _check_text(option, value) -> str:
    if not isinstance(value, str) or (not value and not option.tags.get("empty")):
        raise ValueError(f"must be a non-empty string, got {shown(value)}")
    return value


def _parse_ints(text) -> list:
    return [_parse_int(part) for part in text.split(",")]


def _check_ints(option, value) -> tuple:
    length = option.tags["length"]
    if (isinstance(value, str) or not hasattr(value, "__len__") or len(value) != length
            or not all(is_integer(n) and n >= 1 for n in value)):
        raise ValueError(f"must be {length} positive integers, got {shown(value)}")
    return tuple(int(n) for n in value)


def _describe_number(option) -> str:
    return ("an integer " if option.kind is INT else "") + option.range.text() if option.range else (
        "an integer" if option.kind is INT else "a number")


INT = Kind("int", _parse_int, _check_int, _describe_number)
REAL = Kind("real", _parse_real, _check_real, _describe_number)
BOOL = Kind("bool", str, _check_bool, lambda option: "a switch")
CHOICE = Kind("choice", str, _check_choice,
              lambda option: ", ".join(f"`{choice}`" for choice in option.tags.get("listed") or option.allowed()))
TEXT = Kind("text", str, _check_text, lambda option: "a name or path")
INTS = Kind("ints", _parse_ints, _check_ints,
            lambda option: f"{option.tags['length']} positive integers, e.g. `{option.tags['example']}`", "N,N,...")


@dataclass(frozen=True, eq=False)
class Option:
    """One option's declaration: its kind, help (``{range}`` in it stands for the range's text), the
    range of a number, the choices (a tuple, or a function giving the names allowed now), whether
    None is allowed (``optional``), the command line's ``metavar``, the ``key`` it is stored under
    (default: the field's name), other spellings (``aliases``) and free-form ``tags``."""

    kind: Kind
    help: str
    range: Range | None = None
    choices: tuple | Callable | None = None
    optional: bool = False
    metavar: str | None = None
    key: str | None = None
    aliases: tuple = ()
    tags: Mapping = dataclasses.field(default_factory=dict)

    def allowed(self) -> tuple:
        """The choices allowed now (a registry's are read at each call)."""
        return tuple(self.choices()) if callable(self.choices) else tuple(self.choices or ())

    def check(self, value):
        """``value`` in the field's form (tuples for sequences); ValueError saying why it is not allowed."""
        if value is None and self.optional:
            return None
        return self.kind.check(self, value)

    def help_text(self) -> str:
        """The help, with ``{range}`` replaced by the range's text."""
        return self.help.replace("{range}", self.range.text()) if self.range is not None else self.help

    def values_text(self) -> str:
        """What the docs tables write in their "values" column."""
        return self.kind.describe(self) + (", or unset" if self.optional else "")

    def with_tags(self, defaults: Mapping) -> "Option":
        """This declaration with the tags of ``defaults`` that it does not set."""
        return dataclasses.replace(self, tags=types.MappingProxyType({**defaults, **self.tags}))


def _metadata(declared: Option) -> Mapping:
    """A field's metadata: the Option, and its help, kind and tags readable by name."""
    return types.MappingProxyType({OPTION: declared, "help": declared.help_text(), "kind": declared.kind.name,
                                   "optional": declared.optional, "key": declared.key, **declared.tags})


def option(default, kind: Kind, help: str, *, range: Range | None = None, choices=None, optional: bool = False,
           metavar: str | None = None, key: str | None = None, aliases: tuple = (), **tags) -> dataclasses.Field:
    """A config field declaring one option (see ``Option``); ``tags`` are free-form (``resume=``,
    ``geometry=``, ``listed=``, ...)."""
    declared = Option(kind, help, range, choices if callable(choices) or choices is None else tuple(choices),
                      optional, metavar, key, tuple(aliases), types.MappingProxyType(dict(tags)))
    if default is not None or not optional:
        declared.check(default)  # a declaration's default is one of its values
    return dataclasses.field(default=default, metadata=_metadata(declared))


def declaration(field: dataclasses.Field) -> Option:
    """The Option a field declares; KeyError for a field that declares none."""
    return field.metadata[OPTION]


def declares_option(field: dataclasses.Field) -> bool:
    """Whether ``field`` was declared with ``option(...)``."""
    return OPTION in field.metadata


def option_flag(name: str) -> str:
    """``"conv1_channels"`` -> ``"--conv1-channels"``."""
    return "--" + name.replace("_", "-")


class MappingView:
    """A config read as the mapping of its JSON form, ``to_dict()`` (``config["decoder"]``,
    ``config.get(...)``, ``dict(config)``): what a config was before it became a dataclass."""

    def keys(self):
        return self.to_dict().keys()

    def __getitem__(self, key):
        return self.to_dict()[key]

    def __contains__(self, key) -> bool:
        return key in self.to_dict()

    def get(self, key, default=None):
        return self.to_dict().get(key, default)


class OptionsConfig(MappingView):
    """A frozen dataclass of declared options: each checked when the config is built (OptionError
    naming it), ``replace``, ``from_dict``/``to_dict`` (the JSON form, by stored key), and lookups
    by key and tag. ``TAGS``: the class's tags with their defaults, filled into every declaration."""

    TAGS: Mapping = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for value in list(vars(cls).values()):  # (before @dataclass reads the fields)
            if isinstance(value, dataclasses.Field) and declares_option(value):
                value.metadata = _metadata(declaration(value).with_tags(cls.TAGS))

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if declares_option(field):
                try:
                    value = declaration(field).check(getattr(self, field.name))
                except ValueError as exc:
                    raise OptionError(type(self).__name__, field.name, str(exc)) from None
                object.__setattr__(self, field.name, value)

    @classmethod
    def key(cls, field: dataclasses.Field) -> str:
        """The name under which a field is stored (and its command-line option's destination)."""
        return declaration(field).key or field.name

    @classmethod
    def option_fields(cls) -> list:
        """The fields that are options of the command line (declared ones, not the geometry)."""
        return [f for f in dataclasses.fields(cls) if declares_option(f) and not declaration(f).tags.get("geometry")]

    @classmethod
    def option_keys(cls, **where) -> tuple:
        """The stored names of the options whose tags match ``where`` (e.g. ``resume="may change"``)."""
        return tuple(cls.key(f) for f in cls.option_fields()
                     if all(declaration(f).tags.get(tag) == value for tag, value in where.items()))

    @classmethod
    def field_for(cls, key: str) -> dataclasses.Field:
        """The field stored under ``key``; ValueError if there is none."""
        for field in dataclasses.fields(cls):
            if declares_option(field) and cls.key(field) == key:
                return field
        raise ValueError(f"{cls.__name__}: unknown option {key!r}")

    @classmethod
    def check_option(cls, key: str, value):
        """``value`` checked as the option stored under ``key``; OptionError naming it otherwise."""
        try:
            return declaration(cls.field_for(key)).check(value)
        except ValueError as exc:
            raise OptionError(cls.__name__, key, str(exc)) from None

    @classmethod
    def from_dict(cls, d: dict):
        """The config ``to_dict`` (or a checkpoint) stored; ValueError naming an unknown key or a bad value."""
        names = {cls.key(f): f.name for f in dataclasses.fields(cls) if declares_option(f)}
        unknown = sorted(str(k) for k in d if k not in names)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown option{'s' * (len(unknown) > 1)} {', '.join(unknown)}")
        return cls(**{names[k]: v for k, v in d.items()})

    def to_dict(self) -> dict:
        """{stored name: JSON value} of every declared field."""
        return {self.key(f): json_form(getattr(self, f.name)) for f in dataclasses.fields(self) if declares_option(f)}

    def replace(self, **changes):
        """A copy with ``changes`` (field names) applied and checked; an unknown name is an
        UnknownOptionError (a ValueError, and a TypeError as for any unexpected keyword)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise UnknownOptionError(f"{type(self).__name__}: unknown option{'s' * (len(unknown) > 1)} "
                                     f"{', '.join(unknown)}")
        return dataclasses.replace(self, **changes)


def argument_type(field: dataclasses.Field) -> Callable:
    """The argparse type of a field's option: the text parsed as its kind, then checked by it
    (ArgumentTypeError with the check's text); the value is the field's JSON form (lists, not tuples)."""
    declared = declaration(field)

    def option_value(text):
        try:
            return json_form(declared.check(declared.kind.parse(text)))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    option_value.__name__ = field.name  # argparse names the type in "invalid NAME value"
    return option_value


def add_options(parser, config_class, *, names=None, defaults: bool = True, help_now: Mapping | None = None) -> list:
    """Add an option to ``parser`` for each option field of ``config_class`` (those named in
    ``names``, default all) in declaration order; returns the argparse actions. With ``defaults=False``
    each defaults to None (the option was not given). ``help_now``: {field name: a function giving
    the help where it names what is known only at run time}. An action's ``on_resume`` is its
    declaration's ``resume`` tag where it has one."""
    actions = []
    for field in config_class.option_fields():
        if names is not None and field.name not in names:
            continue
        declared = declaration(field)
        key = config_class.key(field)
        flags = (option_flag(key), *declared.aliases)
        settings = dict(dest=key, default=json_form(field.default) if defaults else None,
                        help=(help_now or {}).get(field.name, declared.help_text)())
        if declared.kind is BOOL:
            action = parser.add_argument(*flags, action="store_true", **settings)
        elif declared.tags.get("empty"):  # --tensorboard [DIR]: without DIR, the empty text (the run's default)
            action = parser.add_argument(*flags, nargs="?", const="", metavar=declared.metavar,
                                         type=argument_type(field), **settings)
        elif declared.kind is CHOICE:
            choices = declared.allowed()
            action = parser.add_argument(*flags, choices=choices, type=type(choices[0]), **settings)
        else:
            action = parser.add_argument(*flags, type=argument_type(field),
                                         metavar=declared.metavar or declared.kind.metavar, **settings)
        if "resume" in declared.tags:
            action.on_resume = declared.tags["resume"]
        actions.append(action)
    return actions


def options_table(config_class, columns=(), describe=None) -> str:
    """A docs table of ``config_class``'s declared fields, one row each: option (``(the dataset)``
    for the geometry), field, default (a Python literal, ``unset`` for None), values, then
    ``columns`` ((header, text of an Option) pairs) and what it does (``describe(option)``, default
    its help)."""
    headers = ["option", f"`{config_class.__name__}` field", "default", "values", *(h for h, _ in columns),
               "what it does"]
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    for field in dataclasses.fields(config_class):
        if not declares_option(field):
            continue
        declared = declaration(field)
        flags = (option_flag(config_class.key(field)), *declared.aliases)
        flag_text = "(the dataset)" if declared.tags.get("geometry") else ", ".join(f"`{flag}`" for flag in flags)
        default = "unset" if field.default is None else (
            f'`"{field.default}"`' if isinstance(field.default, str) else f"`{field.default!r}`")
        cells = [flag_text, f"`{field.name}`", default, declared.values_text(),
                 *(text(declared) for _, text in columns), describe(declared) if describe else declared.help_text()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
