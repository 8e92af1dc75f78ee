"""The options of the network family, written once: ``CapsNetConfig`` and ``BaselineCNNConfig``.

Each field is one option with its default, its allowed values and a line of help (in the field's
metadata). The CLI's model options, the checks of a checkpoint's config, ``MODEL_OPTIONS``, the
presets, the memory estimate and the README's options table are derived from these classes, so a
new option is one new field here (and its use in the model).

A config is a frozen dataclass; it also reads as a mapping (``config["decoder"]``,
``config.get(...)``, ``dict(config)``) of its JSON form, which is what checkpoints store:
``to_dict()`` and ``from_dict()`` convert both ways, and an unknown key or a bad value is a
``ValueError`` naming the field.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
from dataclasses import dataclass

import numpy as np

from .decoders import DECODERS
from .initialization import CAPSULE_INITS
from .losses import SPREAD_MARGIN_SCHEDULES
from .recipes import (CLASS_LOSSES, FROM_RECIPE, INPUT_ACTIVATIONS, INVERSE_TEMPERATURE_RANGE, PARTS, RECIPES,
                      Recipe, RecipePartError, checked_inverse_temperature, resolve)
from .routing.em import EM_COST_SCALES, EM_INITIAL_ASSIGNMENTS
from .routing import GRADIENT_MODES, routing_names, routing_recipe, routing_traits
from .squash import DEFAULT_SQUASH_EPS, SQUASHES

CONVENTIONS = ("paper", "official")
MAX_ROUTING_ITERATIONS = 100


def parse_hidden_capsules(spec) -> list:
    """Hidden capsule layers as a list of [count, dim]: from a sequence of (count, dim) pairs or
    from text such as "32x12,32x12" ("" or None: no hidden layer)."""
    if spec is None or spec == "":
        return []
    if isinstance(spec, str):
        pairs = []
        for part in spec.split(","):
            fields = part.strip().lower().split("x")
            if len(fields) != 2 or not all(f.strip().isdigit() for f in fields):
                raise ValueError(f"hidden capsules: expected COUNTxDIM pairs such as 32x12,32x12, got {spec!r}")
            pairs.append((int(fields[0]), int(fields[1])))
        spec = pairs
    layers = []
    for pair in spec:
        if len(pair) != 2 or any(int(n) != n or int(n) < 1 for n in pair):
            raise ValueError(f"hidden capsules: each layer is a (count, dim) pair of positive integers, got {pair!r}")
        layers.append([int(pair[0]), int(pair[1])])
    return layers


# --- field declarations: the kind of value, its bounds and its help travel in the metadata ---

def _option(default, kind: str, help: str, *, geometry=False, key=None, **bounds):
    metadata = dict(kind=kind, help=help, geometry=geometry, key=key, **bounds)
    return dataclasses.field(default=default, metadata=metadata)


def integer(default: int, help: str, low: int = 1, high: int | None = None, geometry: bool = False):
    """An integer option in [low, high] (no upper bound when ``high`` is None)."""
    return _option(default, "int", help, geometry=geometry, low=low, high=high)


def number(default: float, help: str, low: float, high: float, key=None):
    """A finite real option in [low, high)."""
    return _option(default, "float", help, key=key, low=low, high=high)


def choice(default: str, choices, help: str, listed: tuple | None = None):
    """One of ``choices``: a tuple, or a function returning the names allowed now (a registry's);
    ``listed`` the names the README's table shows (default: the choices)."""
    return _option(default, "choice", help, choices=choices if callable(choices) else tuple(choices),
                   listed=listed)


def choices_of(meta) -> tuple:
    """The values a choice option allows now (a registry's choices are read at each call)."""
    choices = meta["choices"]
    return tuple(choices()) if callable(choices) else choices


def flag(default: bool, help: str):
    """True or False."""
    return _option(default, "bool", help)


def integers(default: tuple, help: str, key: str):
    """A fixed number (that of ``default``) of positive integers, stored under ``key``."""
    return _option(default, "ints", help, key=key, length=len(default), low=1)


def capsule_layers(help: str):
    """(count, dim) pairs of positive integers, or text such as "32x12,32x12"."""
    return _option((), "capsule_layers", help)


def schedule(default, help: str, names: tuple, low: float, high: float):
    """A number in [low, high) for every routing iteration, one such number per iteration (a list),
    or one of ``names`` (text such as "paper")."""
    return _option(default, "schedule", help, names=names, low=low, high=high)


class OptionError(ValueError):
    """A bad option value: ``field`` names the option, ``reason`` says what is wrong."""

    def __init__(self, owner: str, field: str, reason: str):
        super().__init__(f"{owner}: {field} {reason}")
        self.field, self.reason = field, reason


class UnknownOptionError(ValueError, TypeError):
    """A keyword that names no option of the config."""


def _shown(value) -> str:
    text = repr(value)
    return type(value).__name__ + (f" {text}" if len(text) < 40 else "")


def _range_text(low, high) -> str:
    return f">= {low}" if high is None else f"in [{low}, {high}]"


def _is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def checked_value(field: dataclasses.Field, value):
    """``value`` in the field's own form (tuples for sequences); raises ValueError saying why it is not allowed."""
    meta = field.metadata
    kind = meta["kind"]
    if kind == "int":
        if not _is_integer(value):
            raise ValueError(f"must be an integer, got {_shown(value)}")
        if value < meta["low"] or (meta["high"] is not None and value > meta["high"]):
            raise ValueError(f"must be an integer {_range_text(meta['low'], meta['high'])}, got {value}")
        return int(value)
    if kind == "float":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {_shown(value)}")
        if not meta["low"] <= value < meta["high"]:
            raise ValueError(f"must lie in [{meta['low']}, {meta['high']}), got {value}")
        return float(value)
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"must be true or false, got {_shown(value)}")
        return bool(value)
    if kind == "choice":
        choices = choices_of(meta)
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {_shown(value)}")
        return value
    if kind == "schedule":
        return checked_inverse_temperature(value)
    if kind == "ints":
        if isinstance(value, str) or not hasattr(value, "__len__") or len(value) != meta["length"]:
            raise ValueError(f"must be {meta['length']} positive integers, got {_shown(value)}")
        if not all(_is_integer(n) and n >= 1 for n in value):
            raise ValueError(f"must be {meta['length']} positive integers, got {_shown(value)}")
        return tuple(int(n) for n in value)
    # capsule_layers
    if isinstance(value, str):
        return tuple(tuple(pair) for pair in parse_hidden_capsules(value))
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"must be a list of [count, dim] pairs, got {_shown(value)}")
    for k, pair in enumerate(value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(_is_integer(n) and n >= 1 for n in pair):
            raise ValueError(f"must be [count, dim] pairs of positive integers; layer {k} is {_shown(pair)}")
    return tuple((int(count), int(dim)) for count, dim in value)


def _json_form(value):
    """A field's value as checkpoints and config.json store it (sequences as lists)."""
    if isinstance(value, tuple):
        return [_json_form(v) for v in value]
    return value


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


class ModelConfig(MappingView):
    """What CapsNetConfig and BaselineCNNConfig share: checks, the dict form and the mapping view."""

    MODEL = ""  # the --model name

    def __post_init__(self):
        for field in dataclasses.fields(self):
            try:
                value = checked_value(field, getattr(self, field.name))
            except ValueError as exc:
                raise OptionError(type(self).__name__, field.name, str(exc)) from None
            object.__setattr__(self, field.name, value)

    @classmethod
    def key(cls, field: dataclasses.Field) -> str:
        """The name under which a field is stored (and its CLI option's destination)."""
        return field.metadata["key"] or field.name

    @classmethod
    def option_fields(cls) -> list:
        """The fields that are model options (not the image geometry, which the dataset gives)."""
        return [f for f in dataclasses.fields(cls) if not f.metadata["geometry"]]

    @classmethod
    def option_keys(cls) -> tuple:
        """The stored names of the model options, in declaration order."""
        return tuple(cls.key(f) for f in cls.option_fields())

    @classmethod
    def field_for(cls, key: str) -> dataclasses.Field:
        """The field stored under ``key``; ValueError if there is none."""
        for field in dataclasses.fields(cls):
            if cls.key(field) == key:
                return field
        raise ValueError(f"{cls.__name__}: unknown option {key!r}")

    @classmethod
    def check_option(cls, key: str, value):
        """``value`` checked as the option stored under ``key``; OptionError naming it otherwise."""
        field = cls.field_for(key)
        try:
            return checked_value(field, value)
        except ValueError as exc:
            raise OptionError(cls.__name__, key, str(exc)) from None

    @classmethod
    def resolved(cls, config=None, **overrides):
        """``config`` (an instance, its dict form, or None for the defaults) with ``overrides`` (fields
        as keywords) applied: what a model's constructor takes."""
        if config is None:
            config = cls()
        elif not isinstance(config, cls):
            config = cls.from_dict(config)
        return config.replace(**overrides) if overrides else config

    @classmethod
    def from_dict(cls, d: dict):
        """The config a checkpoint (or ``to_dict``) stored; ValueError naming an unknown key or a bad value."""
        d = {k: v for k, v in d.items() if not (k == "model" and v == cls.MODEL)}
        names = {cls.key(f): f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in d if k not in names)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown option{'s' * (len(unknown) > 1)} {', '.join(unknown)}")
        return cls(**{names[k]: v for k, v in d.items()})

    def to_dict(self) -> dict:
        """{stored name: JSON value} of every field (what a checkpoint's config holds for the model)."""
        return {self.key(f): _json_form(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def replace(self, **changes):
        """A copy with ``changes`` (field names) applied and checked; an unknown name is an
        UnknownOptionError (a ValueError, and a TypeError as for any unexpected keyword)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise UnknownOptionError(f"{type(self).__name__}: unknown option{'s' * (len(unknown) > 1)} "
                                     f"{', '.join(unknown)}")
        return dataclasses.replace(self, **changes)



@dataclass(frozen=True)
class CapsNetConfig(ModelConfig):
    """A CapsNet: the image geometry and every model option (the defaults give the paper's network)."""

    MODEL = "capsnet"

    in_channels: int = integer(1, "image channels (from the dataset)", geometry=True)
    image_size: int = integer(28, "image side in pixels (from the dataset)", geometry=True)
    num_classes: int = integer(10, "classes, one digit capsule each (from the dataset)", geometry=True)
    routing_iterations: int = integer(3, "routing iterations of every routing layer", high=MAX_ROUTING_ITERATIONS)
    routing_gradient: str = choice("full", GRADIENT_MODES,
                                   "gradient through every routing iteration, or through the last one only")
    decoder: str = choice("fc", DECODERS, "the paper's fully connected decoder or the transposed-conv one")
    conv1_channels: int = integer(256, "channels of the first convolution")
    primary_types: int = integer(32, "primary capsule types")
    primary_dim: int = integer(8, "values per primary capsule")
    digit_dim: int = integer(16, "values per digit (class) capsule")
    kernel_size: int = integer(9, "side of both convolutions' kernels")
    hidden_capsules: tuple = capsule_layers("fully connected capsule layers between PrimaryCaps and DigitCaps")
    capsule_bias: bool = flag(False, "a learned bias per output capsule of every routing layer, added before "
                                     "the squash")
    routing: str = choice("dynamic", routing_names,
                          "the routing algorithm of every routing layer: dynamic routing (Procedure 1), uniform "
                          "coupling c = 1/J, EM routing, self-attention routing, self-routing, or one registered "
                          "with register_routing", listed=routing_names(builtin=True))
    conventions: str = choice("paper", CONVENTIONS,
                              "the paper's equations or the official code's biases, initialization and margin "
                              "scaling")
    leaky_routing: bool = flag(False, "an extra zero logit in the routing softmax (\"none of the above\")")
    squash: str = choice(FROM_RECIPE, (FROM_RECIPE, *SQUASHES),
                         "the capsule nonlinearity of every capsule layer: Sabour et al.'s (cubic near 0, zero "
                         "slope there), Peer et al.'s code's (linear near 0) or Mazzia et al.'s (efficient); "
                         "recipe: the recipe's (sabour under common)")
    squash_eps: float = number(DEFAULT_SQUASH_EPS, "the squash's epsilon (Peer et al.'s capsnet-limitations uses "
                                                   "1e-8, gamma-capsule-network 1e-12)", low=1e-30, high=1.0)
    em_inverse_temperature: object = schedule(
        FROM_RECIPE, "EM routing's inverse temperature lambda (--routing em; other routings take one number and "
                     "ignore it): paper is Hinton et al.'s 0.01 (1 - 0.95^(r+1)) at iteration r, recipe the "
                     "recipe's (1e-3 under common, paper under authors); the cost sums over the input capsules and "
                     "pose values, so lambda = 1 saturates the activations (a = 1, no gradient) at the start",
        (FROM_RECIPE, "paper"), *INVERSE_TEMPERATURE_RANGE)
    capsule_init: str = choice(FROM_RECIPE, (FROM_RECIPE, *CAPSULE_INITS),
                               "the routing layers' initial weights and biases: the model's own (default), Peer et "
                               "al.'s code's (weights N(0, 0.2), biases 0.1), Efficient-CapsNet's (he-normal) or "
                               "SR-CapsNet's (kaiming-uniform); recipe: the recipe's (default under common)")
    recipe: str = choice("common", RECIPES,
                         "the parts around the routing: common (the same for every routing: lengths as input "
                         "activations, margin loss, default init, Sabour's squash, lambda 1e-3) or authors (the "
                         "routing's authors' own, docs/routing.md); --input-activations, --class-loss, "
                         "--capsule-init, --squash and --em-inverse-temperature set one part each and win")
    input_activations: str = choice(FROM_RECIPE, (FROM_RECIPE, *INPUT_ACTIVATIONS),
                                    "the input activations of the first routing layer where its routing reads them "
                                    "(em, self-routing): the primary capsules' lengths, or learned (a sigmoid of a "
                                    "batch-normed convolution beside PrimaryCaps); recipe: the recipe's")
    class_loss: str = choice(FROM_RECIPE, (FROM_RECIPE, *CLASS_LOSSES),
                             "the loss on the class scores: margin (Sabour et al.), spread (Hinton et al. 2018, its "
                             "margin by --spread-margin-schedule) or nll (-log of the target's score, for "
                             "self-routing's scores, which sum to 1); recipe: the recipe's (margin under common)")
    spread_margin_schedule: str = choice(
        FROM_RECIPE, (FROM_RECIPE, *SPREAD_MARGIN_SCHEDULES),
        "the spread loss's margin over the run: paper (0.2 to 0.9, linear in the steps done), ibm (the authors' "
        "formula of the global step, as IBM's code runs it: 0.2 + 0.79 sigmoid(min(10, step/50000 - 4))) or "
        "sr-capsnet (SR-CapsNet's 0.2 + 0.2 epoch/epochs); recipe: the recipe's (paper under common, ibm under "
        "em's authors'); refused with another class loss")
    em_cost_scale: str = choice(
        "none", EM_COST_SCALES,
        "EM routing's cost scaling (--routing em): none (Hinton et al.'s Procedure 1, SR-CapsNet) or ibm (IBM's "
        "code multiplies the cost by 100 J / I, J output and I input capsules)")
    em_initial_assignment: str = choice(
        "uniform", EM_INITIAL_ASSIGNMENTS,
        "EM routing's first assignments R (--routing em): uniform 1/J (Procedure 1, IBM's code) or ones "
        "(SR-CapsNet's code, which scales the first M-step's mass by J)")

    def __post_init__(self):
        super().__post_init__()
        self.recipe_parts()  # a part that does not apply to the routing: an OptionError naming it
        if not routing_traits(self.routing).has_inverse_temperature:
            for name, default in (("em_cost_scale", "none"), ("em_initial_assignment", "uniform")):
                if getattr(self, name) != default:
                    raise OptionError(type(self).__name__, name, f"applies to EM routing only (--routing em), not "
                                                                 f"to routing {self.routing!r}")

    def recipe_parts(self) -> Recipe:
        """The six parts the model uses (``recipes.PARTS``): each part set here, the others the
        recipe's (``recipe``: "common", or "authors": the routing's registered recipe). OptionError
        naming the part where one does not apply to the routing."""
        try:
            return resolve(self.recipe, {part: getattr(self, part) for part in PARTS}, routing_recipe(self.routing),
                           routing_traits(self.routing), self.routing_iterations)
        except RecipePartError as exc:
            raise OptionError(type(self).__name__, exc.part, exc.reason) from None


@dataclass(frozen=True)
class BaselineCNNConfig(ModelConfig):
    """The baseline CNN of Sabour et al. (2017), section 5 (``--model cnn``); stored as cnn_channels,
    cnn_hidden and dropout beside the geometry."""

    MODEL = "cnn"

    in_channels: int = integer(1, "image channels (from the dataset)", geometry=True)
    image_size: int = integer(28, "image side in pixels (from the dataset)", geometry=True)
    num_classes: int = integer(10, "classes (from the dataset)", geometry=True)
    channels: tuple = integers((256, 256, 128), "channels of the three 5x5 convolutions", key="cnn_channels")
    hidden: tuple = integers((328, 192), "units of the two hidden fully connected layers", key="cnn_hidden")
    dropout: float = number(0.5, "dropout rate before the last layer", low=0.0, high=1.0, key="dropout")

    def to_dict(self) -> dict:
        return dict(model=self.MODEL, **super().to_dict())


def keyword_signature(config_class) -> inspect.Signature:
    """``(self, config=None, *, FIELD=DEFAULT, ...)``: a model constructor's signature with the
    config's fields as keyword overrides, so that help() and inspect show every option and default."""
    keywords = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
                for f in dataclasses.fields(config_class)]
    return inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                              inspect.Parameter("config", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
                              *keywords])


MODEL_CONFIGS = {"capsnet": CapsNetConfig, "cnn": BaselineCNNConfig}
MODEL_OPTIONS = CapsNetConfig.option_keys()
CNN_OPTIONS = BaselineCNNConfig.option_keys()
