"""The gradient-mode check lives in one place, ``capsnet/routing/base.py``: a routing layer, the
routing registry, the gradient-flow report, the ``gradflow`` command and a training run all ask it,
so each refusal is one text, whoever gives it."""
import itertools

import numpy as np
import pytest

import tinygrad_caps as tc
from cli_helpers import TINY_CPU, tiny_data_dir, train_argv
from tinygrad_caps.models import CapsNet, cli
from tinygrad_caps.models.analysis.gradflow import check_mode, mode_gradient_cosines, supported_modes
from tinygrad_caps.models.app.cli.gradflow import parse_modes
from tinygrad_caps.models.capsnet.routing import (GRADIENT_MODES, CapsuleLayer, EMRoutingLayer,
                                                  SelfAttentionRoutingLayer, SelfRoutingLayer, check_gradient_mode,
                                                  gradient_mode_refusal, layer_modes, other_mode_refusal,
                                                  routing_refusal, unknown_mode_refusal)
from tinygrad_caps.models.capsnet.routing import supported_modes as modes_of_layers
from tinygrad_caps.models.errors import UsageError

SMALL = dict(image_size=12, kernel_size=5, conv1_channels=4, primary_types=1, primary_dim=3, digit_dim=2,
             num_classes=3)
# (routing name, the layer class that name builds)
LAYERS = {"dynamic": CapsuleLayer, "em": EMRoutingLayer, "self-attention": SelfAttentionRoutingLayer,
          "self-routing": SelfRoutingLayer}
ONE_STEP = ("self-attention", "self-routing")


def layer(routing):
    return LAYERS[routing](4, 3, 3, 2, routing=routing)


def test_the_texts_say_what_is_refused_and_why():
    assert gradient_mode_refusal("self-routing", "detach", ("full",)) == (
        "routing 'self-routing' is not iterative: it has no 'detach' gradient mode (only full)")
    assert gradient_mode_refusal("dynamic", "half", GRADIENT_MODES) == (
        "gradient must be one of ('full', 'detach'), got 'half'")
    assert gradient_mode_refusal("dynamic", "detach", GRADIENT_MODES) is None
    assert unknown_mode_refusal("sideways") == "unknown mode 'sideways'; choose from full, detach"
    assert unknown_mode_refusal("sideways", "mode") == "mode must be one of ('full', 'detach'), got 'sideways'"
    assert [unknown_mode_refusal(mode, argument) for mode in GRADIENT_MODES for argument in (None, "x")] == [None] * 4
    assert other_mode_refusal("self-attention", ("full",)) == (
        "--log-mode-cosine: routing 'self-attention' is not iterative; it has one gradient mode, so there is no "
        "other mode to compare with")
    assert other_mode_refusal("dynamic", GRADIENT_MODES) is None


@pytest.mark.parametrize("routings", [combo for n in (1, 2) for combo in itertools.combinations_with_replacement(
    LAYERS, n)])
@pytest.mark.parametrize("mode", [*GRADIENT_MODES, "half"])
def test_a_mode_is_refused_exactly_where_some_layer_does_not_take_it(routings, mode):
    layers = [layer(routing) for routing in routings]
    modes = modes_of_layers(layers)
    assert modes == (("full",) if set(routings) & set(ONE_STEP) else GRADIENT_MODES)
    assert all(set(modes) <= set(layer_modes(one)) for one in layers)
    if mode in modes:
        check_gradient_mode(layers, mode, "who")
        return
    with pytest.raises(ValueError) as refused:
        check_gradient_mode(layers, mode, "who")
    first = next(one for one in layers if mode not in layer_modes(one))
    refusal = unknown_mode_refusal(mode, "mode") or gradient_mode_refusal(first.routing, mode, layer_modes(first))
    assert str(refused.value) == f"who: {refusal}"


@pytest.mark.parametrize("routing", ONE_STEP)
def test_the_layer_the_registry_the_report_and_the_command_give_the_same_refusal(routing):
    text = gradient_mode_refusal(routing, "detach", ("full",))
    with pytest.raises(ValueError) as built:
        CapsNet(routing=routing, routing_gradient="detach", **SMALL)
    assert str(built.value) == text
    assert routing_refusal(routing, "detach") == text
    model = CapsNet(routing=routing, **SMALL)
    with pytest.raises(ValueError) as switched:
        model.digit.gradient = "detach"
    assert str(switched.value) == text
    assert supported_modes(model) == ("full",)
    with pytest.raises(ValueError) as reported:
        check_mode(model, "detach")
    assert str(reported.value) == f"gradient_flow_report: {text}"
    with pytest.raises(UsageError) as parsed:
        parse_modes("full,detach", model)
    assert str(parsed.value) == f"--modes: {text}"
    assert parse_modes(None, model) == ("full",)


def test_an_unknown_mode_is_refused_with_the_base_texts():
    with pytest.raises(UsageError) as parsed:
        parse_modes("full,sideways")
    assert str(parsed.value) == "--modes: " + unknown_mode_refusal("sideways")
    model = CapsNet(**SMALL)
    with pytest.raises(ValueError) as reported:
        check_mode(model, "sideways", "--modes")
    assert str(reported.value) == "--modes: mode must be one of ('full', 'detach'), got 'sideways'"
    assert gradient_mode_refusal("dynamic", "sideways", GRADIENT_MODES) == unknown_mode_refusal("sideways", "gradient")
    assert parse_modes(None, model) == GRADIENT_MODES == supported_modes(model)


def test_a_routing_with_one_mode_has_no_other_to_compare_with():
    tc.manual_seed(0)
    model = CapsNet(routing="self-routing", **SMALL).to(dtype="float64")
    x, y = np.random.default_rng(0).random((2, 1, 12, 12)), np.array([0, 2])
    with pytest.raises(ValueError) as refused:
        mode_gradient_cosines(model, x, y)
    assert str(refused.value) == other_mode_refusal("self-routing", ("full",), "mode_gradient_cosines")


def test_a_training_run_gives_the_same_log_mode_cosine_refusal(tmp_path, capsys):
    data = tiny_data_dir(tmp_path / "data", (8, 4))
    argv = train_argv(data, tmp_path / "run", "--routing", "self-routing", "--log-gradflow", "1",
                      "--log-mode-cosine", options=TINY_CPU)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tinygrad-caps train: error: {other_mode_refusal('self-routing', ('full',))}"]
