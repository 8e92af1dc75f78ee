"""Training recipes: the parts around the routing that a routing's authors' code uses, by name.

A recipe fixes six parts (``PARTS``), each also an option of its own (a ``CapsNetConfig`` field):

    input_activations       "lengths" (the primary capsules' lengths) or "learned" (a sigmoid of a
                            batch-normed convolution beside PrimaryCaps, ``primary_activations.py``);
                            read by the routings that take input activations (EM routing, self-routing)
    class_loss              the loss on the class scores (``losses.py``): "margin" (Sabour et al.),
                            "spread" (Hinton et al. 2018) or "nll" (-log of the target's score: the
                            routings whose scores sum to 1)
    spread_margin_schedule  how the spread loss's margin moves (``losses.SPREAD_MARGIN_SCHEDULES``):
                            "paper" (0.2 to 0.9, linear over the run), "ibm" (the authors' formula of
                            the global step, as IBM's code runs it) or "sr-capsnet" (SR-CapsNet's line
                            over the epochs); read by the spread loss only
    capsule_init            how the routing layers' weights start (``initialization.CAPSULE_INITS``)
    squash                  the capsule nonlinearity (``squash.SQUASHES``)
    em_inverse_temperature  EM routing's lambda: a number, one per iteration, or "paper"
                            (``paper_inverse_temperatures``)

``COMMON`` is the recipe every routing shares (the model before recipes existed); a routing's
registration may carry its authors' recipe (``register_routing(..., recipe=...)``), which
``CapsNet(recipe="authors")`` applies. A part set explicitly wins over either recipe; the value
``FROM_RECIPE`` ("recipe", every part's default) takes the recipe's. A part that does not apply
to the chosen routing (``part_refusal``: learned input activations for a routing that reads none,
the NLL for class scores that do not sum to 1, an EM schedule, "paper" or a list, without EM
routing), and a margin schedule set for a class loss other than the spread loss, are refused in one line; one number for lambda is taken by every routing, as every run's
config.json from before recipes records one.

This module imports nothing from ``routing/``: the registry imports it, and ``CapsNetConfig`` hands
``resolve`` the authors' recipe and the routing's traits (``routing_recipe``, ``routing_traits``).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

from .initialization import CAPSULE_INITS
from .losses import CLASS_LOSSES, SPREAD_MARGIN_SCHEDULES
from .squash import SQUASHES

RECIPES = ("common", "authors")
PARTS = ("input_activations", "class_loss", "capsule_init", "squash", "em_inverse_temperature",
         "spread_margin_schedule")
FROM_RECIPE = "recipe"  # a part's default: the recipe's value
INPUT_ACTIVATIONS = ("lengths", "learned")
PAPER_SCHEDULE = "paper"
# Hinton et al.'s schedule (their answer on OpenReview, as IBM's, SR-CapsNet's and Peer et al.'s code use it):
# lambda_r = PAPER_FINAL_INVERSE_TEMPERATURE * (1 - PAPER_INVERSE_TEMPERATURE_DECAY ** (r + 1)), r = 0 .. R-1.
PAPER_FINAL_INVERSE_TEMPERATURE = 0.01
PAPER_INVERSE_TEMPERATURE_DECAY = 0.95
INVERSE_TEMPERATURE_RANGE = (1e-9, 1e3)  # [low, high) of every lambda


class RecipePartError(ValueError):
    """A part's value that the recipe or the routing does not allow: ``part`` names it, ``reason`` says why."""

    def __init__(self, part: str, reason: str):
        super().__init__(f"{part} {reason}")
        self.part, self.reason = part, reason


def paper_inverse_temperatures(iterations: int) -> list:
    """Hinton et al.'s lambda for each of ``iterations`` EM iterations: 0.01 (1 - 0.95^(r+1)), r = 0..R-1."""
    if not isinstance(iterations, numbers.Integral) or iterations < 1:
        raise ValueError(f"paper_inverse_temperatures: iterations must be an integer >= 1, got {iterations!r}")
    return [PAPER_FINAL_INVERSE_TEMPERATURE * (1 - PAPER_INVERSE_TEMPERATURE_DECAY ** (r + 1))
            for r in range(iterations)]


def checked_inverse_temperature(value):
    """``value`` as em_inverse_temperature holds it: a float, a tuple of floats (one per iteration),
    "paper" or "recipe"; ValueError saying why it is none of these."""
    low, high = INVERSE_TEMPERATURE_RANGE

    def one(x):
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
            raise ValueError(f"must be a number, one number per routing iteration, {PAPER_SCHEDULE} or "
                             f"{FROM_RECIPE}, got {type(x).__name__} {x!r}")
        if not low <= x < high:
            raise ValueError(f"must lie in [{low:g}, {high:g}), got {x}")
        return float(x)

    if isinstance(value, str):
        if value not in (FROM_RECIPE, PAPER_SCHEDULE):
            raise ValueError(f"must be a number, one number per routing iteration, {PAPER_SCHEDULE} or "
                             f"{FROM_RECIPE}, got {value!r}")
        return value
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("must hold one number per routing iteration, got none")
        return tuple(one(x) for x in value)
    return one(value)


def inverse_temperature_schedule(value, iterations: int) -> list:
    """lambda per iteration (``iterations`` floats) of a resolved em_inverse_temperature: a number for
    all, one per iteration, or "paper"."""
    if value == PAPER_SCHEDULE:
        return paper_inverse_temperatures(iterations)
    if isinstance(value, (list, tuple)):
        if len(value) != iterations:
            raise ValueError(f"em_inverse_temperature has {len(value)} values for {iterations} routing iterations")
        return [float(x) for x in value]
    return [float(value)] * iterations


@dataclass(frozen=True)
class Recipe:
    """The six parts of a recipe, resolved (no "recipe" left); the defaults are ``COMMON``'s."""

    input_activations: str = "lengths"
    class_loss: str = "margin"
    capsule_init: str = "default"
    squash: str = "sabour"
    em_inverse_temperature: object = 1e-3
    spread_margin_schedule: str = "paper"

    def __post_init__(self):
        allowed = {"input_activations": INPUT_ACTIVATIONS, "class_loss": CLASS_LOSSES,
                   "capsule_init": tuple(CAPSULE_INITS), "squash": tuple(SQUASHES),
                   "spread_margin_schedule": SPREAD_MARGIN_SCHEDULES}
        for part, choices in allowed.items():
            value = getattr(self, part)
            if value not in choices:
                raise RecipePartError(part, f"must be one of {', '.join(choices)}, got {value!r}")
        try:
            schedule = checked_inverse_temperature(self.em_inverse_temperature)
        except ValueError as exc:
            raise RecipePartError("em_inverse_temperature", str(exc)) from None
        if schedule == FROM_RECIPE:
            raise RecipePartError("em_inverse_temperature", "must be a number, a list or paper in a recipe")
        object.__setattr__(self, "em_inverse_temperature", schedule)

    @classmethod
    def of(cls, recipe) -> "Recipe":
        """``recipe`` as a Recipe: a Recipe, a dict of parts (the rest ``COMMON``'s), or None (``COMMON``);
        RecipePartError naming an unknown part or a bad value."""
        if recipe is None:
            return COMMON
        if isinstance(recipe, cls):
            return recipe
        if not isinstance(recipe, dict):
            raise TypeError(f"a recipe is a Recipe or a dict of its parts ({', '.join(PARTS)}), got "
                            f"{type(recipe).__name__}")
        unknown = sorted(set(recipe) - set(PARTS))
        if unknown:
            raise RecipePartError(unknown[0], f"is not a part of a recipe (the parts: {', '.join(PARTS)})")
        return cls(**recipe)

    def to_dict(self) -> dict:
        """{part: value} (a schedule as a list), for printing and JSON."""
        d = dataclasses.asdict(self)
        if isinstance(d["em_inverse_temperature"], tuple):
            d["em_inverse_temperature"] = list(d["em_inverse_temperature"])
        return d


COMMON = Recipe()


@dataclass(frozen=True)
class RoutingTraits:
    """What a routing's layers do that decides which parts apply to it (read from its layer class:
    ``RoutingLayer.reads_activations``, ``class_distribution``, ``has_inverse_temperature``)."""

    name: str
    reads_activations: bool = False
    class_distribution: bool = False
    has_inverse_temperature: bool = False

    @classmethod
    def of(cls, name: str, layer_factory) -> "RoutingTraits":
        """The traits of routing ``name`` built by ``layer_factory`` (a factory that is not a
        RoutingLayer class has none of them)."""
        return cls(name, *(bool(getattr(layer_factory, trait, False)) for trait in
                           ("reads_activations", "class_distribution", "has_inverse_temperature")))


def part_refusal(part: str, value, traits: RoutingTraits):
    """Why ``part`` set to ``value`` does not apply to the routing of ``traits`` (one line, starting
    after the part's name), or None."""
    name = traits.name
    if part == "input_activations" and value == "learned" and not traits.reads_activations:
        return (f"learned applies to routings that read input activations (em, self-routing), not to routing "
                f"{name!r}")
    if part == "class_loss" and value == "nll" and not traits.class_distribution:
        return (f"nll reads the log of class scores that sum to 1 (self-routing's), not routing {name!r}'s "
                "(margin or spread)")
    # one number is taken (and unused) by every routing, as before recipes: every config.json records one
    if part == "em_inverse_temperature" and not traits.has_inverse_temperature and (
            value == PAPER_SCHEDULE or isinstance(value, (list, tuple))):
        return f"schedule applies to EM routing only (--routing em), not to routing {name!r}"
    return None


def check_recipe_applies(recipe: Recipe, traits: RoutingTraits) -> Recipe:
    """``recipe`` if each of its parts applies to the routing of ``traits``; else RecipePartError."""
    for part in PARTS:
        refusal = part_refusal(part, getattr(recipe, part), traits)
        if refusal:
            raise RecipePartError(part, refusal)
    return recipe


def resolve(recipe: str, given: dict, authors: Recipe, traits: RoutingTraits, iterations: int) -> Recipe:
    """The parts a model uses: each part of ``given`` ({part: value}; "recipe" or absent: the
    recipe's) over ``COMMON`` (``recipe`` "common") or ``authors`` (the routing's authors' recipe,
    ``recipe`` "authors"). RecipePartError (naming the part, in one line) for an unknown recipe, a
    part that does not apply to the routing of ``traits``, or a schedule whose length is not
    ``iterations``; a margin schedule given for a class loss other than the spread loss."""
    if recipe not in RECIPES:
        raise RecipePartError("recipe", f"must be one of {', '.join(RECIPES)}, got {recipe!r}")
    base = COMMON if recipe == "common" else authors
    values = {}
    for part in PARTS:
        value = given.get(part, FROM_RECIPE)
        if value == FROM_RECIPE:
            values[part] = getattr(base, part)
            continue
        refusal = part_refusal(part, value, traits)
        if refusal:
            raise RecipePartError(part, refusal)
        values[part] = value
    resolved = Recipe(**values)
    if given.get("spread_margin_schedule", FROM_RECIPE) != FROM_RECIPE and resolved.class_loss != "spread":
        raise RecipePartError("spread_margin_schedule", f"applies to the spread loss only (--class-loss spread), "
                                                        f"not to the {resolved.class_loss} loss")
    schedule = resolved.em_inverse_temperature
    if traits.has_inverse_temperature and isinstance(schedule, tuple) and len(schedule) != iterations:
        raise RecipePartError("em_inverse_temperature", f"has {len(schedule)} values for {iterations} routing "
                                                        "iterations (one per iteration)")
    return resolved
