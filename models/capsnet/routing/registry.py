"""The routings by name: the registry that ``CapsNet(routing=NAME)``, ``--routing NAME``,
checkpoints, presets and studies take names from, and the one-line refusals of options a routing
does not take.

Built in (``routing_names(builtin=True)``), each beside its layer in a module of this package:

    "dynamic"         Sabour et al. (2017), Procedure 1 (``dynamic.dynamic_routing``, ``dynamic.CapsuleLayer``)
    "uniform"         c = 1/J, one weighted sum (``uniform.uniform_routing``, ``dynamic.CapsuleLayer``); one
                      step, but "detach" is accepted (it is the same computation) as it was before the registry
    "em"              EM routing, Hinton et al. (2018), vector poses (``em.em_routing``, ``em.EMRoutingLayer``);
                      parameters beta_u, beta_a (J,) from 0; the output activations are the class scores
    "self-attention"  Mazzia et al. (2021), FCCaps (``self_attention.self_attention_routing``,
                      ``self_attention.SelfAttentionRoutingLayer``); parameter attention_bias (I, J) from 0; one step
    "self-routing"    Hahn et al. (2019) (``self_routing.self_routing``, ``self_routing.SelfRoutingLayer``);
                      parameters route_weight (I, J, K) and route_bias (I, J) from 0 (uniform routing at the
                      start); the output activations are the class scores; one step

Register your own with ``register_routing(name, layer_factory)``: ``layer_factory(in_caps, in_dim,
out_caps, out_dim, *, routing, iterations, gradient, bias, leaky_routing, squash)`` returns the
layer; a ``RoutingLayer`` subclass (``base.py``) is such a factory (see docs/routing.md).

A registration may carry its authors' training recipe (``recipe=``: a ``recipes.Recipe`` or a dict
of its parts), which ``CapsNet(recipe="authors")`` applies; one without it trains as the common
recipe under either. The built-in recipes (``AUTHORS_RECIPES``) follow the authors' code (the table
of docs/routing.md, "Recipes", gives the file and line of each part).
"""
from __future__ import annotations

from tinygrad_caps import nn

from ..recipes import COMMON, Recipe, RecipePartError, RoutingTraits, check_recipe_applies
from .base import RoutingLayer, gradient_mode_refusal
from .dynamic import CapsuleLayer
from .em import EMRoutingLayer
from .self_attention import SelfAttentionRoutingLayer
from .self_routing import SelfRoutingLayer

_ROUTINGS: dict = {}  # name -> layer factory
_RECIPES: dict = {}   # name -> its authors' Recipe
BUILTIN_ROUTINGS = ("dynamic", "uniform", "em", "self-attention", "self-routing")


def register_routing(name: str, layer_factory, *, replace: bool = False, recipe=None):
    """Make ``name`` a routing of ``CapsNet(routing=name)``, ``--routing name``, checkpoints and
    studies. ``layer_factory(in_caps, in_dim, out_caps, out_dim, *, routing, iterations, gradient,
    bias, leaky_routing, squash)`` builds one routing layer (a ``RoutingLayer`` subclass is one).
    ``recipe``: its authors' training recipe (a ``Recipe``, or a dict of some of its parts, the rest
    the common recipe's; None: the common recipe), what ``recipe="authors"`` applies; a part that does
    not apply to the layer (learned input activations for a routing that reads none, say) is a
    ValueError. A name registered already is refused unless ``replace``; the built-in names are never
    replaced. Returns ``layer_factory``."""
    if not isinstance(name, str) or not name or not all(ch.isalnum() or ch in "-_." for ch in name):
        raise ValueError(f"register_routing: {name!r} is not a usable name (letters, digits, '-', '_', '.')")
    if not callable(layer_factory):
        raise TypeError(f"register_routing: the layer factory of {name!r} must be callable")
    if name in _ROUTINGS and (name in BUILTIN_ROUTINGS or not replace):
        raise ValueError(f"register_routing: a routing named {name!r} is registered already"
                         + ("" if name in BUILTIN_ROUTINGS else " (replace=True to replace it)"))
    try:
        authors = check_recipe_applies(Recipe.of(recipe), RoutingTraits.of(name, layer_factory))
    except RecipePartError as exc:
        raise ValueError(f"register_routing: the recipe of {name!r}: {exc}") from None
    _ROUTINGS[name], _RECIPES[name] = layer_factory, authors
    return layer_factory


def unregister_routing(name: str) -> None:
    """Forget a routing registered with ``register_routing`` (the built-in ones stay)."""
    if name in BUILTIN_ROUTINGS:
        raise ValueError(f"unregister_routing: {name!r} is built in")
    _ROUTINGS.pop(name, None)
    _RECIPES.pop(name, None)


def routing_recipe(name: str) -> Recipe:
    """The authors' recipe registered with routing ``name`` (the common recipe where it has none);
    ValueError for a name not registered."""
    if name not in _ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(_ROUTINGS)}, got {name!r} (register_routing adds one)")
    return _RECIPES[name]


def routing_traits(name: str) -> RoutingTraits:
    """What routing ``name``'s layers do that decides which recipe parts apply (its layer class's
    ``reads_activations``, ``class_distribution``, ``has_inverse_temperature``); ValueError for a
    name not registered."""
    if name not in _ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(_ROUTINGS)}, got {name!r} (register_routing adds one)")
    return RoutingTraits.of(name, _ROUTINGS[name])


def routing_names(builtin: bool = False) -> tuple:
    """The registered routing names, the built-in ones first (only those with ``builtin``)."""
    return BUILTIN_ROUTINGS if builtin else tuple(_ROUTINGS)


def routing_refusal(name: str, gradient: str = "full", bias: bool = False, leaky_routing: bool = False):
    """Why a layer of routing ``name`` would refuse these options (one line), or None; read from the
    factory's class attributes where it is a ``RoutingLayer`` subclass (any other factory says so
    itself when called)."""
    factory = _ROUTINGS.get(name)
    if not (isinstance(factory, type) and issubclass(factory, RoutingLayer)) or factory is CapsuleLayer:
        return None
    refusal = gradient_mode_refusal(name, gradient, factory.modes())
    if refusal:
        return refusal
    if bias and not factory.has_bias:
        return f"routing {name!r} takes no capsule bias (--capsule-bias, --conventions official)"
    if leaky_routing and not factory.has_leaky_routing:
        return f"routing {name!r} takes no leaky routing (--leaky-routing)"
    return None


def routing_parameter_count(name: str, in_caps, in_dim, out_caps, out_dim, bias=False) -> int:
    """The number of parameters of a layer of routing ``name``: its class's own count where the
    factory is a ``RoutingLayer`` subclass, else the weight and bias every routing layer has."""
    factory = _ROUTINGS.get(name)
    layer_class = factory if isinstance(factory, type) and issubclass(factory, RoutingLayer) else RoutingLayer
    return layer_class.parameter_count(in_caps, in_dim, out_caps, out_dim, bias)


def routing_layer(name: str, in_caps, in_dim, out_caps, out_dim, **options):
    """A routing layer of the registered routing ``name`` (options as ``register_routing`` lists them);
    TypeError where its factory returns something that is not a ``RoutingLayer`` (``check_routing_layer``)."""
    if name not in _ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(_ROUTINGS)}, got {name!r} (register_routing adds one)")
    return check_routing_layer(name, _ROUTINGS[name](in_caps, in_dim, out_caps, out_dim, routing=name, **options))


# What a CapsNet uses of each routing layer: route() in its forward, weight and bias in its initialisations.
ROUTING_LAYER_MEMBERS = ("route", "weight", "bias")


def check_routing_layer(name: str, layer):
    """``layer`` if it is what the factory of routing ``name`` must return (a ``RoutingLayer``);
    else a TypeError naming the routing, what the factory returned and what that lacks."""
    if isinstance(layer, RoutingLayer):
        return layer
    advice = "the factory must return a RoutingLayer: subclass RoutingLayer and write route_votes (docs/routing.md)"
    if layer is None:
        raise TypeError(f"routing {name!r}: its layer factory returned None, not a layer; {advice}")
    lacks = [] if callable(getattr(layer, "route", None)) else ["route()"]
    lacks += [member for member in ROUTING_LAYER_MEMBERS[1:] if not hasattr(layer, member)]
    if not isinstance(layer, nn.Module):
        lacks.append("Module parameters")
    missing = f"it has no {', no '.join(lacks)}" if lacks else "it does not derive from RoutingLayer"
    raise TypeError(f"routing {name!r}: its layer factory returned a {type(layer).__module__}."
                    f"{type(layer).__qualname__}, not a RoutingLayer ({missing}); {advice}")


# The authors' recipes of the built-in routings (docs/routing.md, "Recipes": the file and line of each part).
AUTHORS_RECIPES = {
    # Sabour et al.'s (Sarasra/models research/capsules): margin loss on the lengths, their squash: the common recipe.
    "dynamic": COMMON,
    # Hinton et al. (2018) as IBM's and SR-CapsNet's code train it: input activations a sigmoid of a
    # batch-normed convolution (SR-CapsNet's), the spread loss with the margin formula the authors gave on
    # OpenReview (IBM's models.py), lambda 0.01 (1 - 0.95^(r+1)) (both codes), the votes' weights
    # kaiming_uniform_ on SR-CapsNet's EmRouting2d fan-in. Both codes train with the full gradient.
    "em": Recipe(input_activations="learned", class_loss="spread", capsule_init="kaiming-uniform",
                 em_inverse_temperature="paper", spread_margin_schedule="ibm"),
    # Mazzia et al.'s Efficient-CapsNet: margin loss on the lengths, FCCaps' W from he_normal, their squash.
    "self-attention": Recipe(capsule_init="he-normal", squash="efficient"),
    # Hahn et al.'s SR-CapsNet: learned input activations, NLL on log a_out, W kaiming_uniform_.
    "self-routing": Recipe(input_activations="learned", class_loss="nll", capsule_init="kaiming-uniform"),
}

for _name, _factory in (("dynamic", CapsuleLayer), ("uniform", CapsuleLayer), ("em", EMRoutingLayer),
                        ("self-attention", SelfAttentionRoutingLayer), ("self-routing", SelfRoutingLayer)):
    register_routing(_name, _factory, recipe=AUTHORS_RECIPES.get(_name))
