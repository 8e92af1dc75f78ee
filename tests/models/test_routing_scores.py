"""Peer et al.'s T-score and D-score as their authors define them, on hand-made couplings and outputs:
float64 on couplings renormalised to sum to 1 (a uniform coupling gives T = 0 exactly and a one-hot
one T = 1 at any float dtype), the dtype's resolution, the network's T (mean over routing layers)
and D (the hidden layers), in the gradient-flow report and the command's table."""
import math

import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps.models import CapsNet, gradient_flow_report
from tinygrad_caps.models.analysis.routing_statistics import (coupling_entropy, network_scores, t_score,
                                                              t_score_resolution)
from tinygrad_caps.models.app.cli.gradflow import format_report


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("outputs", [2, 3, 7, 10, 32, 1152])
def test_a_uniform_coupling_has_t_zero_and_a_one_hot_one_exactly(dtype, outputs):
    uniform = np.full((2, 5, outputs), 1.0 / outputs, dtype=dtype)
    assert t_score(uniform) == 0.0 and coupling_entropy(uniform) == 1.0
    one_hot = np.zeros((2, 5, outputs), dtype=dtype)
    one_hot[:, :, outputs // 2] = 1
    assert t_score(one_hot) == 1.0 and coupling_entropy(one_hot) == 0.0


def test_softmax_of_zero_logits_in_float32_is_uniform_where_the_float32_formula_was_not():
    """Routing's first iteration at initialisation: c = softmax(0) in float32. The entropy summed in
    float32 gave T = -1.4e-8 (what RESULTS.md once reported as a measurement); renormalised in float64
    it is 0."""
    c = F.softmax(tc.zeros((32, 576, 10), dtype="float32"), axis=2).numpy()
    old = 1.0 + float((c * np.log(c)).sum(axis=-1, dtype=np.float32).mean(dtype=np.float32) / math.log(10))
    assert abs(old) > 1e-9
    assert t_score(c) == 0.0


def test_leaky_couplings_are_renormalised_before_the_entropy():
    """With leaky routing a row sums to J / (J + 1): it is the distribution over the J real outputs."""
    leaky = np.full((1, 3, 4), 1.0 / 5)
    assert t_score(leaky) == 0.0
    half = np.array([[[0.4, 0.4, 0.0, 0.0]]])
    assert t_score(half) == pytest.approx(1 - math.log(2) / math.log(4), abs=1e-15)


def test_a_coupling_one_rounding_unit_from_uniform_is_at_the_dtypes_resolution():
    resolution = t_score_resolution("float32", 10)
    assert 1e-15 < resolution < 1e-14
    assert t_score_resolution("float64", 10) < 1e-30 and t_score_resolution("float32", 1) == 0.0
    c = np.full((1, 1, 10), np.float32(0.1))
    c[0, 0, 0] = np.nextafter(np.float32(0.1), np.float32(1))
    assert 0 < t_score(c) < 10 * resolution


def test_t_score_by_hand_and_rows_averaged():
    c = np.array([[[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]])
    expected = ((1 - math.log(2) / math.log(4)) + 1.0) / 2
    assert t_score(c) == pytest.approx(expected, abs=1e-15)
    with pytest.raises(ValueError, match="t_score"):
        t_score(np.ones((2, 3)))


def layer(name, t, d):
    return {"name": name, "iterations": [{"t_score": 0.5, "d_score": 9.0}, {"t_score": t, "d_score": d}]}


def test_network_scores_mean_t_over_routing_layers_and_d_of_the_hidden_layers():
    scores = network_scores([layer("hidden.0", 0.2, 0.3), layer("hidden.1", 0.4, 0.5), layer("digit", 0.9, 0.7)])
    assert scores["t_score"] == pytest.approx(0.5) and scores["d_score"] == pytest.approx(0.4)
    assert scores["digit_d_score"] == 0.7 and scores["layers"]["hidden.1"] == {"t_score": 0.4, "d_score": 0.5}
    alone = network_scores([layer("digit", 0.1, 0.2)])
    assert alone["t_score"] == 0.1 and alone["d_score"] is None and alone["digit_d_score"] == 0.2
    with pytest.raises(ValueError):
        network_scores([])


def test_the_report_gives_every_routing_layers_scores_and_the_networks():
    tc.manual_seed(0)
    model = CapsNet(image_size=12, kernel_size=3, conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4,
                    hidden_capsules="5x4", capsule_bias=True, squash="peer", capsule_init="peer")
    x = np.random.default_rng(0).random((6, 1, 12, 12)).astype(np.float32)
    report = gradient_flow_report(model, x, np.arange(6) % 10, modes=("full",))
    full = report["modes"]["full"]
    hidden, digit = (layer["iterations"][-1] for layer in full["layers"])
    network = full["network"]
    assert network["t_score"] == pytest.approx((hidden["t_score"] + digit["t_score"]) / 2)
    assert network["d_score"] == hidden["d_score"] > 0 and network["digit_d_score"] == digit["d_score"]
    assert "network: T-score" in format_report(report) and "(hidden layers;" in format_report(report)
