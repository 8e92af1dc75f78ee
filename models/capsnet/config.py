"""The options of the network family, written once: ``CapsNetConfig`` and ``BaselineCNNConfig``.

Each field is one option declared with ``tinygrad_caps.models.options.option`` (its kind, its range
or choices, a line of help). The CLI's model options, the checks of a checkpoint's config,
``MODEL_OPTIONS``, the presets, the memory estimate and the README's options table are derived from
these classes, so a new option is one new field here (and its use in the model).

A config is a frozen dataclass; it also reads as a mapping (``config["decoder"]``,
``config.get(...)``, ``dict(config)``) of its JSON form, which is what checkpoints store:
``to_dict()`` and ``from_dict()`` convert both ways, and an unknown key or a bad value is a
``ValueError`` naming the field. Two kinds of option are a model's own: ``CAPSULE_LAYERS`` and
``SCHEDULE``.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

from ..options import (BOOL, CHOICE, INT, INTS, POSITIVE, REAL, Kind, MappingView, OptionError, OptionsConfig,
                       Range, UnknownOptionError, declaration, is_integer, option, shown)
from .decoders import DECODERS, FC_DECODER_HIDDEN
from .initialization import CAPSULE_INITS
from .losses import SPREAD_MARGIN_SCHEDULES
from .recipes import (CLASS_LOSSES, FROM_RECIPE, INPUT_ACTIVATIONS, INVERSE_TEMPERATURE_RANGE, PAPER_SCHEDULE, PARTS,
                      RECIPES, Recipe, RecipePartError, checked_inverse_temperature, resolve)
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


# --- the kinds of option only a model has (the others are tinygrad_caps.models.options') ---

def _parse_schedule(text: str):
    """A schedule's text: a name ("paper", "recipe") as it is, else one number or numbers separated by commas."""
    if text in (FROM_RECIPE, PAPER_SCHEDULE):
        return text
    parts = [REAL.parse(part) for part in text.split(",")]
    return parts[0] if len(parts) == 1 else parts


def _check_capsule_layers(option, value) -> tuple:
    if isinstance(value, str):
        return tuple(tuple(pair) for pair in parse_hidden_capsules(value))
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"must be a list of [count, dim] pairs, got {shown(value)}")
    for k, pair in enumerate(value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(is_integer(n) and n >= 1 for n in pair):
            raise ValueError(f"must be [count, dim] pairs of positive integers; layer {k} is {shown(pair)}")
    return tuple((int(count), int(dim)) for count, dim in value)


CAPSULE_LAYERS = Kind("capsule_layers", str, _check_capsule_layers,
                      lambda option: "COUNTxDIM pairs, e.g. `32x12,32x12`", "COUNTxDIM,...")
"""(count, dim) pairs of positive integers, or text such as "32x12,32x12"."""
SCHEDULE = Kind("schedule", _parse_schedule, lambda option, value: checked_inverse_temperature(value),
                lambda option: f"a number {option.range.text()}, one per iteration (`L1,L2,...`), "
                               f"{', '.join(f'`{name}`' for name in (FROM_RECIPE, PAPER_SCHEDULE))}",
                "L|L1,L2,...|NAME")
"""A number for every routing iteration, one number per iteration (a list), or a name ("paper", "recipe")."""


def _integers(default: tuple, help: str, key: str) -> dataclasses.Field:
    """A fixed number (that of ``default``) of positive integers, stored under ``key``."""
    return option(default, INTS, help, key=key, length=len(default), example=",".join(map(str, default)))


def _geometry(default: int, help: str) -> dataclasses.Field:
    """A field of the image geometry: the dataset gives it, no option sets it."""
    return option(default, INT, help, range=POSITIVE, geometry=True)


class ModelConfig(OptionsConfig):
    """What CapsNetConfig and BaselineCNNConfig share: the declared options (``OptionsConfig``), the
    dict form and the mapping view, and ``resolved`` (a config for a model's constructor)."""

    MODEL = ""  # the --model name
    TAGS = {"geometry": False}

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
        return super().from_dict({k: v for k, v in d.items() if not (k == "model" and v == cls.MODEL)})


@dataclass(frozen=True)
class CapsNetConfig(ModelConfig):
    """A CapsNet: the image geometry and every model option (the defaults give the paper's network)."""

    MODEL = "capsnet"

    in_channels: int = _geometry(1, "image channels (from the dataset)")
    image_size: int = _geometry(28, "image side in pixels (from the dataset)")
    num_classes: int = _geometry(10, "classes, one digit capsule each (from the dataset)")
    routing_iterations: int = option(3, INT, "routing iterations of every routing layer",
                                     range=Range(1, MAX_ROUTING_ITERATIONS))
    routing_gradient: str = option("full", CHOICE,
                                   "gradient through every routing iteration, or through the last one only",
                                   choices=GRADIENT_MODES)
    decoder: str = option("fc", CHOICE, "the paper's fully connected decoder or the transposed-conv one",
                          choices=DECODERS)
    decoder_hidden: tuple = _integers(FC_DECODER_HIDDEN, "units of the fully connected decoder's two hidden layers "
                                      "(--decoder fc; the paper's 512,1024)", key="decoder_hidden")
    conv1_channels: int = option(256, INT, "channels of the first convolution", range=POSITIVE)
    primary_types: int = option(32, INT, "primary capsule types", range=POSITIVE)
    primary_dim: int = option(8, INT, "values per primary capsule", range=POSITIVE)
    digit_dim: int = option(16, INT, "values per digit (class) capsule", range=POSITIVE)
    kernel_size: int = option(9, INT, "side of both convolutions' kernels", range=POSITIVE)
    hidden_capsules: tuple = option((), CAPSULE_LAYERS,
                                    "fully connected capsule layers between PrimaryCaps and DigitCaps")
    capsule_bias: bool = option(False, BOOL, "a learned bias per output capsule of every routing layer, added before "
                                     "the squash")
    routing: str = option("dynamic", CHOICE,
                          "the routing algorithm of every routing layer: dynamic routing (Procedure 1), uniform "
                          "coupling c = 1/J, EM routing, self-attention routing, self-routing, or one registered "
                          "with register_routing", choices=routing_names, listed=routing_names(builtin=True))
    conventions: str = option("paper", CHOICE,
                              "the paper's equations or the official code's biases, initialization and margin "
                              "scaling", choices=CONVENTIONS)
    leaky_routing: bool = option(False, BOOL, "an extra zero logit in the routing softmax (\"none of the above\")",
                                 aliases=("--none-of-the-above",))
    squash: str = option(FROM_RECIPE, CHOICE,
                         "the capsule nonlinearity of every capsule layer: Sabour et al.'s (cubic near 0, zero "
                         "slope there), Peer et al.'s code's (linear near 0) or Mazzia et al.'s (efficient); "
                         "recipe: the recipe's (sabour under common)", choices=(FROM_RECIPE, *SQUASHES))
    squash_eps: float = option(DEFAULT_SQUASH_EPS, REAL, "the squash's epsilon (Peer et al.'s capsnet-limitations uses "
                                                        "1e-8, gamma-capsule-network 1e-12)",
                                range=Range(1e-30, 1.0, high_open=True))
    em_inverse_temperature: object = option(
        FROM_RECIPE, SCHEDULE,
        "EM routing's inverse temperature lambda (--routing em; other routings take one number and ignore it): paper "
        "is Hinton et al.'s 0.01 (1 - 0.95^(r+1)) at iteration r, recipe the recipe's (1e-3 under common, paper under "
        "authors); the cost sums over the input capsules and pose values, so lambda = 1 saturates the activations "
        "(a = 1, no gradient) at the start",
        range=Range(*INVERSE_TEMPERATURE_RANGE, high_open=True))
    capsule_init: str = option(FROM_RECIPE, CHOICE,
                               "the routing layers' initial weights and biases: the model's own (default), Peer et "
                               "al.'s code's (weights N(0, 0.2), biases 0.1), Efficient-CapsNet's (he-normal) or "
                               "SR-CapsNet's (kaiming-uniform); recipe: the recipe's (default under common)",
                               choices=(FROM_RECIPE, *CAPSULE_INITS))
    recipe: str = option("common", CHOICE,
                         "the parts around the routing: common (the same for every routing: lengths as input "
                         "activations, margin loss, default init, Sabour's squash, lambda 1e-3) or authors (the "
                         "routing's authors' own, docs/routing.md); --input-activations, --class-loss, "
                         "--capsule-init, --squash and --em-inverse-temperature set one part each and win",
                         choices=RECIPES)
    input_activations: str = option(FROM_RECIPE, CHOICE,
                                    "the input activations of the first routing layer where its routing reads them "
                                    "(em, self-routing): the primary capsules' lengths, or learned (a sigmoid of a "
                                    "batch-normed convolution beside PrimaryCaps); recipe: the recipe's",
                                    choices=(FROM_RECIPE, *INPUT_ACTIVATIONS))
    class_loss: str = option(FROM_RECIPE, CHOICE,
                             "the loss on the class scores: margin (Sabour et al.), spread (Hinton et al. 2018, its "
                             "margin by --spread-margin-schedule) or nll (-log of the target's score, for "
                             "self-routing's scores, which sum to 1); recipe: the recipe's (margin under common)",
                             choices=(FROM_RECIPE, *CLASS_LOSSES))
    spread_margin_schedule: str = option(
        FROM_RECIPE, CHOICE,
        "the spread loss's margin over the run: paper (0.2 to 0.9, linear in the steps done), ibm (the authors' "
        "formula of the global step, as IBM's code runs it: 0.2 + 0.79 sigmoid(min(10, step/50000 - 4))) or "
        "sr-capsnet (SR-CapsNet's 0.2 + 0.2 epoch/epochs); recipe: the recipe's (paper under common, ibm under "
        "em's authors'); refused with another class loss", choices=(FROM_RECIPE, *SPREAD_MARGIN_SCHEDULES))
    em_cost_scale: str = option(
        "none", CHOICE,
        "EM routing's cost scaling (--routing em): none (Hinton et al.'s Procedure 1, SR-CapsNet) or ibm (IBM's "
        "code multiplies the cost by 100 J / I, J output and I input capsules)", choices=EM_COST_SCALES)
    em_initial_assignment: str = option(
        "uniform", CHOICE,
        "EM routing's first assignments R (--routing em): uniform 1/J (Procedure 1, IBM's code) or ones "
        "(SR-CapsNet's code, which scales the first M-step's mass by J)", choices=EM_INITIAL_ASSIGNMENTS)

    def __post_init__(self):
        super().__post_init__()
        self.recipe_parts()  # a part that does not apply to the routing: an OptionError naming it
        if self.decoder != "fc" and tuple(self.decoder_hidden) != FC_DECODER_HIDDEN:
            raise OptionError(type(self).__name__, "decoder_hidden",
                              f"sizes the fully connected decoder (--decoder fc), not the {self.decoder!r} one")
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

    in_channels: int = _geometry(1, "image channels (from the dataset)")
    image_size: int = _geometry(28, "image side in pixels (from the dataset)")
    num_classes: int = _geometry(10, "classes (from the dataset)")
    channels: tuple = _integers((256, 256, 128), "channels of the three 5x5 convolutions", key="cnn_channels")
    hidden: tuple = _integers((328, 192), "units of the two hidden fully connected layers", key="cnn_hidden")
    dropout: float = option(0.5, REAL, "dropout rate before the last layer", range=Range(0.0, 1.0, high_open=True))

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
