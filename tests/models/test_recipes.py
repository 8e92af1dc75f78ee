"""Training recipes (models/capsnet/recipes.py): each part of the authors' recipes against a NumPy port
of their formulas (tests/oracles/reference_recipes.py, float64, small shapes), the new losses'
first and second derivatives, the common recipe as the model was before recipes, a part set
explicitly winning, one-line refusals, and the routing traces and gradflow under every recipe."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps import functional as F
from reference_recipes import (ibm_layer_norm_factor, ibm_margin, inverse_temperatures, keras_he_normal_std,
                               learned_activations, nll_of_log, spread_loss as reference_spread_loss,
                               spread_margin as reference_spread_margin, sr_capsnet_margin,
                               torch_kaiming_uniform_bound)
from reference_routing_algorithms import em_route
from tinygrad_caps.gradcheck import check_double_grad, check_grad
from tinygrad_caps.models import (CapsNet, CapsNetConfig, RoutingLayer, capsule_loss, cli, gradient_flow_report,
                                  register_routing, unregister_routing)
from tinygrad_caps.models.capsnet.losses import (TrainingPosition, ibm_spread_margin, nll_loss,
                                                scheduled_spread_margin, spread_loss, spread_margin,
                                                sr_capsnet_spread_margin, training_loss)
from tinygrad_caps.models.capsnet.recipes import COMMON, PARTS, Recipe, paper_inverse_temperatures
from tinygrad_caps.models.capsnet.routing import AUTHORS_RECIPES, BUILTIN_ROUTINGS, routing_recipe

from paths import ROOT

# 3 classes; kernel 3 on 12x12 images: conv1 10x10, PrimaryCaps 4x4, so 16 * primary_types input capsules
SMALL = dict(image_size=12, kernel_size=3, conv1_channels=4, primary_types=2, primary_dim=3, digit_dim=4,
             num_classes=3)
RECIPE_ROUTINGS = ("dynamic", "em", "self-attention", "self-routing")


def batch(n=4, seed=0, size=12):
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 3
    x = rng.random((n, 1, size, size)) * 0.2
    for k, label in enumerate(labels):  # a class is a bright band
        x[k, 0, 4 * label:4 * label + 4, :] += 0.8
    return x, labels


def scores_away_from_kinks(seed, margin, shape=(5, 4)):
    """Class scores in (0.05, 1) whose gaps a_t - a_i all lie 0.02 or more from ``margin`` (the spread
    loss's relu kinks), with their labels."""
    rng = np.random.default_rng(seed)
    while True:
        scores = rng.uniform(0.05, 1.0, shape)
        labels = rng.integers(0, shape[1], shape[0])
        gaps = scores[np.arange(shape[0]), labels][:, None] - scores
        if np.all(np.abs(gaps - margin) > 0.02):
            return scores, labels


# ----- the losses, against the authors' formulas -----
@pytest.mark.parametrize("margin", [0.2, 0.55, 0.9])
def test_spread_loss_is_hinton_et_al_s_equation_3(margin):
    scores, labels = scores_away_from_kinks(1, margin)
    ours = spread_loss(tc.tensor(scores), labels, margin).numpy()
    np.testing.assert_allclose(ours, reference_spread_loss(scores, labels, margin), rtol=1e-12, atol=1e-15)
    assert ours.shape == (5,)


def test_spread_margin_goes_from_0_2_to_0_9_with_the_share_of_steps_done():
    for progress in (-0.5, 0.0, 0.1, 0.5, 0.999, 1.0, 3.0):
        assert spread_margin(progress) == pytest.approx(reference_spread_margin(progress), abs=1e-15)
    assert (spread_margin(0.0), spread_margin(1.0)) == (0.2, pytest.approx(0.9, abs=1e-15))


def test_nll_is_minus_the_log_of_the_targets_score():
    scores, labels = scores_away_from_kinks(2, 0.5)
    np.testing.assert_allclose(nll_loss(tc.tensor(scores), labels).numpy(), nll_of_log(scores, labels), rtol=1e-12,
                               atol=1e-15)


def test_float32_losses_agree_with_the_float64_formulas():
    scores, labels = scores_away_from_kinks(3, 0.6)
    low = tc.tensor(scores.astype(np.float32))
    np.testing.assert_allclose(spread_loss(low, labels, 0.6).numpy(), reference_spread_loss(scores, labels, 0.6),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nll_loss(low, labels).numpy(), nll_of_log(scores, labels), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("margin", [0.2, 0.9])
def test_spread_loss_first_and_second_order_gradients(margin):
    scores, labels = scores_away_from_kinks(4, margin)
    check_grad(lambda s: spread_loss(s, labels, margin), [scores])
    check_double_grad(lambda s: spread_loss(s, labels, margin), [scores])


def test_nll_first_and_second_order_gradients():
    scores, labels = scores_away_from_kinks(5, 0.5)
    check_grad(lambda s: nll_loss(s, labels), [scores])
    check_double_grad(lambda s: nll_loss(s, labels), [scores])


@pytest.mark.parametrize("kind", ["spread", "nll"])
def test_training_loss_gradients_through_scores_and_reconstruction(kind):
    scores, labels = scores_away_from_kinks(6, 0.4, shape=(3, 3))
    images = np.random.default_rng(7).random((3, 1, 2, 2))
    recon = np.random.default_rng(8).random((3, 4))

    def f(s, r):
        return training_loss(s, r, images, labels, kind, reconstruction_weight=0.1, margin=0.4)

    check_grad(f, [scores, recon])
    check_double_grad(f, [scores, recon])


@pytest.mark.parametrize("loss", [spread_loss, nll_loss])
def test_the_new_losses_refuse_bad_shapes_naming_the_op(loss):
    with pytest.raises(ValueError, match=rf"{loss.__name__}: expected class scores \(B, K\), got shape \(4,\)"):
        loss(tc.tensor(np.full(4, 0.5)), np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match=rf"{loss.__name__}: labels of shape \(3,\) do not fit scores \(4, 2\)"):
        loss(tc.tensor(np.full((4, 2), 0.5)), np.zeros(3, dtype=int))


# ----- the model's loss -----
def test_the_common_recipe_is_the_model_before_recipes():
    """Every routing, both conventions: the parts are the old defaults, the weights the same draws, and
    model.loss is capsule_loss to the last bit."""
    x, y = batch()
    for routing in BUILTIN_ROUTINGS:
        for conventions in (("paper", "official") if routing in ("dynamic", "uniform") else ("paper",)):
            tc.manual_seed(3)
            model = CapsNet(routing=routing, conventions=conventions, **SMALL)
            tc.manual_seed(3)
            spelled = CapsNet(routing=routing, conventions=conventions, squash="sabour", capsule_init="default",
                              em_inverse_temperature=1e-3, input_activations="lengths", class_loss="margin", **SMALL)
            assert model.recipe_parts == COMMON == spelled.recipe_parts and model.primary_activations is None
            for (name, a), (_, b) in zip(model.named_parameters(), spelled.named_parameters()):
                np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
            out = model(x, y)
            expected = capsule_loss(out.lengths, out.reconstruction, x, y, 0.01, convention=conventions)
            assert model.loss(out, x, y, 0.01).numpy().tobytes() == expected.numpy().tobytes()
    assert CapsNet(routing="em", **SMALL).digit.inverse_temperature == 1e-3


def test_authors_recipes_are_the_documented_ones():
    assert {name: routing_recipe(name).to_dict() for name in BUILTIN_ROUTINGS} == {
        "dynamic": COMMON.to_dict(), "uniform": COMMON.to_dict(),
        "em": dict(input_activations="learned", class_loss="spread", capsule_init="kaiming-uniform", squash="sabour",
                   em_inverse_temperature="paper", spread_margin_schedule="ibm"),
        "self-attention": dict(input_activations="lengths", class_loss="margin", capsule_init="he-normal",
                               squash="efficient", em_inverse_temperature=1e-3, spread_margin_schedule="paper"),
        "self-routing": dict(input_activations="learned", class_loss="nll", capsule_init="kaiming-uniform",
                             squash="sabour", em_inverse_temperature=1e-3, spread_margin_schedule="paper")}
    table = (ROOT / "docs" / "routing.md").read_text().split("## Recipes", 1)[1]
    rows = {line.split("`")[1]: line for line in table.splitlines() if line.startswith("| `")}
    for name, recipe in AUTHORS_RECIPES.items():  # each authors' value is named in its routing's row
        for part in PARTS:
            value = recipe.to_dict()[part]
            if part not in ("em_inverse_temperature", "spread_margin_schedule") or name == "em":
                assert f"`{value}`" in rows[name], (name, part, value)


@pytest.mark.parametrize("routing, kind", [("em", "spread"), ("self-routing", "nll"), ("dynamic", "margin"),
                                           ("self-attention", "margin")])
def test_model_loss_is_the_recipes_and_reads_the_training_progress(routing, kind):
    tc.manual_seed(4)
    schedule = dict(spread_margin_schedule="paper") if kind == "spread" else {}
    model = CapsNet(routing=routing, recipe="authors", **SMALL, **schedule).to(dtype="float64")
    x, y = batch()
    out = model(x, y)
    assert model.training_progress == 1.0 and model.loss_follows_progress == (kind == "spread")
    for progress in (0.0, 0.3, 1.0):
        model.training_progress = progress
        expected = training_loss(out.lengths, out.reconstruction, x, y, kind, 0.0005, margin=0.2 + 0.7 * progress)
        np.testing.assert_allclose(model.loss(out, x, y).item(), expected.item(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(model.loss(out, x, y, progress=1.0).item(),
                                   training_loss(out.lengths, out.reconstruction, x, y, kind, 0.0005).item(),
                                   rtol=1e-12, atol=1e-15)
    per_class = {"spread": reference_spread_loss(out.lengths.numpy(), y, 0.2 + 0.7 * 1.0),
                 "nll": nll_of_log(out.lengths.numpy(), y)}.get(kind)
    if per_class is not None:
        loss, class_term, recon = model.loss(out, x, y, 0.0005, return_terms=True)
        np.testing.assert_allclose(class_term.numpy(), per_class, rtol=1e-10, atol=1e-15)
        np.testing.assert_allclose(loss.item(), np.mean(per_class + 0.0005 * recon.numpy()), rtol=1e-12, atol=1e-15)


def test_the_three_margin_schedules_are_the_authors_formulas():
    """paper: the text's line over the run; ibm: the OpenReview formula of the global step as IBM's code
    runs it (about 0.214 for the first thousand steps); sr-capsnet: SR-CapsNet's line over the epochs."""
    for step in (0, 1, 249, 1000, 200_000, 250_000, 450_000, 10 ** 7):
        assert ibm_spread_margin(step) == pytest.approx(ibm_margin(step), abs=1e-15)
    assert 0.2140 < ibm_spread_margin(0) < ibm_spread_margin(250) < 0.2146
    for epochs in (1, 5, 350):
        for epoch in (0, 1, epochs - 1, epochs, epochs + 3):
            assert sr_capsnet_spread_margin(epoch, epochs) == pytest.approx(sr_capsnet_margin(epoch, epochs), abs=1e-15)
    assert sr_capsnet_spread_margin(4, 5) == pytest.approx(0.36, abs=1e-15)
    # 5 epochs of 50 steps: the routing-algorithms study's budget
    for step in (0, 49, 50, 123, 249):
        position = TrainingPosition(step, 50, 5)
        assert scheduled_spread_margin("paper", position) == pytest.approx(reference_spread_margin(step / 250), abs=1e-15)
        assert scheduled_spread_margin("ibm", position) == pytest.approx(ibm_margin(step), abs=1e-15)
        assert scheduled_spread_margin("sr-capsnet", position) == pytest.approx(sr_capsnet_margin(step // 50, 5),
                                                                                abs=1e-15)
    for schedule in ("paper", "ibm", "sr-capsnet"):
        assert scheduled_spread_margin(schedule, None) == 0.9  # a model outside a run: the final margin
    with pytest.raises(ValueError, match="spread margin schedule must be one of paper, ibm, sr-capsnet"):
        scheduled_spread_margin("linear", None)
    with pytest.raises(ValueError, match="TrainingPosition"):
        TrainingPosition(-1, 50, 5)


@pytest.mark.parametrize("schedule", ["paper", "ibm", "sr-capsnet"])
def test_the_models_spread_loss_follows_its_schedule_at_the_position_the_trainer_sets(schedule):
    tc.manual_seed(4)
    model = CapsNet(routing="em", recipe="authors", spread_margin_schedule=schedule, **SMALL).to(dtype="float64")
    x, y = batch()
    out = model(x, y)
    reference = {"paper": lambda s: reference_spread_margin(s / 30), "ibm": ibm_margin,
                 "sr-capsnet": lambda s: sr_capsnet_margin(s // 10, 3)}[schedule]
    for step in (0, 9, 10, 29):
        model.set_training_position(step, 10, 3)
        assert model.training_progress == step / 30
        expected = reference_spread_loss(out.lengths.numpy(), y, reference(step))
        _, class_term, _ = model.loss(out, x, y, return_terms=True)
        np.testing.assert_allclose(class_term.numpy(), expected, rtol=1e-10, atol=1e-15)
    if schedule != "paper":
        with pytest.raises(ValueError, match="progress is the paper schedule's"):
            model.loss(out, x, y, progress=0.5)


def test_em_authors_recipe_takes_the_authors_margin_formula_and_a_schedule_needs_the_spread_loss():
    assert CapsNet(routing="em", recipe="authors", **SMALL).recipe_parts.spread_margin_schedule == "ibm"
    assert CapsNet(routing="em", **SMALL).recipe_parts.spread_margin_schedule == "paper"
    assert CapsNet(routing="em", class_loss="spread", spread_margin_schedule="sr-capsnet",
                   **SMALL).recipe_parts.spread_margin_schedule == "sr-capsnet"
    with pytest.raises(ValueError, match="CapsNetConfig: spread_margin_schedule applies to the spread loss only "
                                         r"\(--class-loss spread\), not to the margin loss"):
        CapsNetConfig(routing="em", spread_margin_schedule="ibm")


# ----- activations, schedule, initializations and squash of the authors' recipes -----
def test_learned_input_activations_are_a_sigmoid_of_a_batch_normed_convolution():
    tc.manual_seed(5)
    model = CapsNet(routing="self-routing", recipe="authors", **SMALL).to(dtype="float64")
    x, y = batch()
    features = F.relu(model.conv1(tc.tensor(x)))
    conv = model.primary_activations.conv
    assert conv.bias is None and conv.stride == 2 and conv.weight.shape == (2, 4, 3, 3)
    ours = model.primary_activations(features).numpy()
    expected = learned_activations(features.numpy(), conv.weight.numpy(), 2)
    np.testing.assert_allclose(ours, expected, rtol=1e-10, atol=1e-12)
    assert ours.shape == (4, model.num_primary)
    # they are what the first routing layer reads: the class scores come from them
    routed = model.digit.route(model.primary(features), tc.tensor(expected))
    np.testing.assert_allclose(model(x, y).lengths.numpy(), routed.activations.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model(x, y).lengths.numpy().sum(axis=1), 1.0, rtol=1e-8)  # (eps 1e-8): NLL reads it


def test_em_authors_lambda_is_the_paper_schedule_per_iteration():
    assert paper_inverse_temperatures(3) == pytest.approx(inverse_temperatures(3), abs=1e-17)
    tc.manual_seed(6)
    model = CapsNet(routing="em", recipe="authors", routing_iterations=3, **SMALL).to(dtype="float64")
    assert model.digit.inverse_temperature == pytest.approx(inverse_temperatures(3), abs=1e-17)
    rng = np.random.default_rng(9)
    u = rng.standard_normal((2, model.num_primary, 3)) * 0.5
    a = rng.uniform(0.1, 0.9, (2, model.num_primary))
    routed = model.digit.route(tc.tensor(u), tc.tensor(a))
    u_hat = np.einsum("ijdk,bik->bijd", model.digit.weight.numpy(), u)
    poses, out_a, _ = em_route(u_hat, a, np.zeros(3), np.zeros(3), 3, inverse_temperatures(3))
    np.testing.assert_allclose(routed.poses.numpy(), poses, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(routed.activations.numpy(), out_a, rtol=1e-9, atol=1e-12)
    explicit = CapsNet(routing="em", em_inverse_temperature=[0.1, 0.2, 0.3], **SMALL)
    assert explicit.digit.inverse_temperature == [0.1, 0.2, 0.3]
    assert CapsNet(routing="em", em_inverse_temperature="paper", **SMALL).recipe_parts.class_loss == "margin"


@pytest.mark.parametrize("cost_scale, assignment", [("ibm", "uniform"), ("none", "ones"), ("ibm", "ones")])
def test_em_cost_scale_and_first_assignments_are_ibm_s_and_sr_capsnet_s(cost_scale, assignment):
    """IBM's m_step multiplies the cost by 100 / (I / J); SR-CapsNet's EmRouting2d starts R at 1."""
    tc.manual_seed(6)
    model = CapsNet(routing="em", recipe="authors", em_cost_scale=cost_scale, em_initial_assignment=assignment,
                    **SMALL).to(dtype="float64")
    inputs = model.num_primary
    factor = ibm_layer_norm_factor(inputs, 3) if cost_scale == "ibm" else 1.0
    assert model.digit.cost_factor == pytest.approx(factor, abs=1e-12)
    rng = np.random.default_rng(10)
    u = rng.standard_normal((2, inputs, 3)) * 0.5
    a = rng.uniform(0.1, 0.9, (2, inputs))
    routed = model.digit.route(tc.tensor(u), tc.tensor(a))
    u_hat = np.einsum("ijdk,bik->bijd", model.digit.weight.numpy(), u)
    poses, out_a, _ = em_route(u_hat, a, np.zeros(3), np.zeros(3), 3, inverse_temperatures(3), cost_factor=factor,
                               first_r=1.0 if assignment == "ones" else None)
    np.testing.assert_allclose(routed.poses.numpy(), poses, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(routed.activations.numpy(), out_a, rtol=1e-9, atol=1e-12)
    # the reduced model of the studies: 576 primary capsules, 10 classes
    assert CapsNet(routing="em", em_cost_scale="ibm", conv1_channels=8, primary_types=16).digit.cost_factor == \
        pytest.approx(100 * 10 / 576, abs=1e-12)


@pytest.mark.parametrize("option, value", [("em_cost_scale", "ibm"), ("em_initial_assignment", "ones")])
def test_em_options_are_refused_for_other_routings_in_one_line(option, value):
    with pytest.raises(ValueError, match=rf"CapsNetConfig: {option} applies to EM routing only \(--routing em\), "
                                         "not to routing 'dynamic'"):
        CapsNetConfig(**{option: value})


def test_em_routing_and_its_m_step_check_the_new_arguments():
    from tinygrad_caps.models.capsnet.routing.em import em_cost_scale, em_routing
    u_hat = tc.tensor(np.zeros((1, 2, 3, 4)))
    args = (u_hat, tc.tensor(np.full((1, 2), 0.5)), tc.tensor(np.zeros(3)), tc.tensor(np.zeros(3)))
    with pytest.raises(ValueError, match="em_routing: initial_assignment must be one of uniform, ones, got 'half'"):
        em_routing(*args, initial_assignment="half")
    with pytest.raises(ValueError, match="em_routing: cost_scale must be a finite number > 0, got 0"):
        em_routing(*args, cost_scale=0)
    with pytest.raises(ValueError, match="em_cost_scale: kind must be one of none, ibm"):
        em_cost_scale("sr", 10, 2)


def test_self_attention_authors_weights_are_keras_he_normal():
    tc.manual_seed(7)
    model = CapsNet(routing="self-attention", recipe="authors", **SMALL)
    weight = model.digit.weight.numpy().astype(np.float64)  # ours (I, J, D, K); theirs (J, I, K, D)
    I, J, D, K = weight.shape
    std = keras_he_normal_std((J, I, K, D))
    assert np.abs(weight).max() <= 2 * std * (1 + 1e-6)
    # a unit normal cut at +-2 has standard deviation 0.8796: Keras' correction gives back sqrt(2 / fan_in)
    assert np.std(weight) == pytest.approx(std * 0.87962566103423978, rel=0.1)
    assert model.primary.squash.name == model.digit.squash.name == "efficient"


@pytest.mark.parametrize("routing", ["self-routing", "em"])
def test_self_routing_and_em_authors_weights_are_pytorch_kaiming_uniform(routing):
    """On the fan-in PyTorch computes for SR-CapsNet's own layout of that routing's weight:
    SelfRouting2d's W1 (kkA, B*D, C), EmRouting2d's W (kkA, B, 4, 4) (D = 4 pose values here, a 2x2 matrix)."""
    tc.manual_seed(8)
    weight = CapsNet(routing=routing, recipe="authors", **SMALL).digit.weight.numpy().astype(np.float64)
    I, J, D, K = weight.shape
    side = int(round(D ** 0.5))
    their_shape = (I, J * D, K) if routing == "self-routing" else (I, J, side, side)
    bound = torch_kaiming_uniform_bound(their_shape)
    assert np.abs(weight).max() <= bound * (1 + 1e-6) and np.abs(weight).max() > 0.9 * bound
    assert np.std(weight) == pytest.approx(bound / np.sqrt(3), rel=0.1)


def test_a_part_set_explicitly_wins_over_the_authors_recipe():
    tc.manual_seed(9)
    common = CapsNet(routing="self-attention", **SMALL)
    tc.manual_seed(9)
    mixed = CapsNet(routing="self-attention", recipe="authors", capsule_init="default", **SMALL)
    assert mixed.recipe_parts == Recipe(squash="efficient")
    np.testing.assert_array_equal(mixed.digit.weight.numpy(), common.digit.weight.numpy())
    plain = CapsNet(routing="self-routing", recipe="authors", input_activations="lengths", class_loss="margin",
                    **SMALL)
    assert plain.primary_activations is None and plain.recipe_parts.capsule_init == "kaiming-uniform"
    assert CapsNet(routing="em", recipe="authors", em_inverse_temperature=0.01, **SMALL).digit.inverse_temperature \
        == 0.01
    learned = CapsNet(routing="self-routing", input_activations="learned", **SMALL)  # one part, common recipe
    assert learned.primary_activations is not None and learned.recipe_parts.class_loss == "margin"


def test_parameter_count_state_dict_and_config_keep_the_recipe():
    tc.manual_seed(10)
    model = CapsNet(routing="em", recipe="authors", em_inverse_temperature=[0.01, 0.02, 0.03], **SMALL)
    names = {name for name, _ in model.named_parameters()}
    assert {"primary_activations.conv.weight", "primary_activations.norm.weight",
            "primary_activations.norm.bias"} <= names
    assert CapsNet.parameter_count(model.config) == sum(p.data.size for p in model.parameters())
    assert CapsNet.parameter_count(model.config) == CapsNet.parameter_count(model.config.replace(recipe="common")) \
        + 4 * 2 * 3 * 3 + 2 * 2
    stored = model.config.to_dict()
    assert stored["recipe"] == "authors" and stored["em_inverse_temperature"] == [0.01, 0.02, 0.03]
    again = CapsNet(CapsNetConfig.from_dict(stored))
    again.load_state_dict(model.state_dict())
    x, y = batch()
    np.testing.assert_array_equal(again(x, y).lengths.numpy(), model(x, y).lengths.numpy())


# ----- refusals -----
@pytest.mark.parametrize("options, field, message", [
    (dict(recipe="theirs"), "recipe", "must be one of common, authors, got str 'theirs'"),
    (dict(input_activations="learned"), "input_activations",
     "learned applies to routings that read input activations (em, self-routing), not to routing 'dynamic'"),
    (dict(routing="em", class_loss="nll"), "class_loss", "nll reads the log of class scores that sum to 1"),
    (dict(class_loss="nll", recipe="authors"), "class_loss", "not routing 'dynamic'"),
    (dict(em_inverse_temperature="paper"), "em_inverse_temperature",
     "schedule applies to EM routing only (--routing em), not to routing 'dynamic'"),
    (dict(routing="self-routing", em_inverse_temperature=[0.1, 0.1, 0.1]), "em_inverse_temperature",
     "not to routing 'self-routing'"),
    (dict(routing="em", em_inverse_temperature=[0.1, 0.2]), "em_inverse_temperature",
     "has 2 values for 3 routing iterations"),
    (dict(routing="em", em_inverse_temperature="fast"), "em_inverse_temperature", "got 'fast'"),
    (dict(routing="em", em_inverse_temperature=[]), "em_inverse_temperature", "one number per routing iteration"),
    (dict(capsule_init="glorot"), "capsule_init", "must be one of recipe, default, peer"),
])
def test_an_unknown_recipe_or_a_part_that_does_not_apply_is_a_one_line_error(options, field, message):
    with pytest.raises(ValueError) as caught:
        CapsNet(**SMALL, **options)
    text = str(caught.value)
    assert text.startswith(f"CapsNetConfig: {field} ") and message in text and "\n" not in text


def test_one_number_for_lambda_is_still_taken_by_every_routing():
    """Every config.json before recipes records em_inverse_temperature 0.001; tests set 1e-2 for all."""
    for routing in BUILTIN_ROUTINGS:
        assert CapsNetConfig(routing=routing, em_inverse_temperature=1e-2).recipe_parts() is not None


class ReadsNothing(RoutingLayer):
    def route_votes(self, u_hat, u, activations, trace):
        return F.squash(F.mean(u_hat, axis=1)), None


def test_a_registered_recipe_must_apply_to_its_layer():
    with pytest.raises(ValueError, match="register_routing: the recipe of 'mean': input_activations learned applies"):
        register_routing("mean", ReadsNothing, recipe={"input_activations": "learned"})
    with pytest.raises(ValueError, match="register_routing: the recipe of 'mean': colour is not a part"):
        register_routing("mean", ReadsNothing, recipe={"colour": "red"})
    register_routing("mean", ReadsNothing, recipe={"squash": "peer", "class_loss": "spread"})
    try:
        model = CapsNet(routing="mean", recipe="authors", **SMALL)
        assert model.recipe_parts == Recipe(squash="peer", class_loss="spread") and model.loss_follows_progress
        assert CapsNet(routing="mean", **SMALL).recipe_parts == COMMON
    finally:
        unregister_routing("mean")


def test_the_options_parse_schedules_and_refuse_bad_values_in_one_line(capsys):
    parser = cli.make_parser()
    args = parser.parse_args(["train", "--recipe", "authors", "--em-inverse-temperature", "0.01,0.02,0.03",
                              "--class-loss", "spread", "--input-activations", "learned"])
    assert (args.recipe, args.em_inverse_temperature, args.class_loss) == ("authors", [0.01, 0.02, 0.03], "spread")
    assert parser.parse_args(["train", "--em-inverse-temperature", "paper"]).em_inverse_temperature == "paper"
    assert parser.parse_args(["train", "--em-inverse-temperature", "0.5"]).em_inverse_temperature == 0.5
    assert parser.parse_args(["train"]).recipe == "common"
    for argv, expected in ((["--recipe", "theirs"], "invalid choice: 'theirs'"),
                           (["--em-inverse-temperature", "fast"], "must be a number"),
                           (["--em-inverse-temperature", "0.1,-1"], "must lie in [1e-09, 1000)")):
        with pytest.raises(SystemExit):
            parser.parse_args(["train", *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert expected in err[-1], err


# ----- the routing traces and gradflow under every recipe -----
def spy_on_votes(layer):
    """Keep the votes u_hat each route of ``layer`` makes (their gradient retained)."""
    seen = []
    original = layer.route_votes

    def route_votes(u_hat, u, activations, trace):
        u_hat.retain_grad()
        seen.append(u_hat)
        return original(u_hat, u, activations, trace)

    layer.route_votes = route_votes
    return seen


@pytest.mark.parametrize("recipe", ["common", "authors"])
@pytest.mark.parametrize("routing", RECIPE_ROUTINGS)
def test_the_traces_paths_are_the_routings_whatever_the_loss(routing, recipe):
    tc.manual_seed(11)
    model = CapsNet(routing=routing, recipe=recipe, hidden_capsules="5x3", **SMALL).to(dtype="float64")
    model.training_progress = 0.4
    votes = {name: spy_on_votes(layer) for name, layer in model.routing_layers()}
    x, y = batch()
    out = model(x, y, return_trace=True)
    for trace in out.traces:
        trace.retain_grad()
    model.loss(out, x, y).backward()
    assert [trace.name for trace in out.traces] == ["hidden.0", "digit"]
    for trace in out.traces:
        u_hat = votes[trace.name][0]
        uses = trace.u_hat_sum + (trace.u_hat_agreement if routing != "self-routing" else [])
        paths = [t.grad.numpy() for t in uses if t.grad is not None]
        np.testing.assert_allclose(sum(paths), u_hat.grad.numpy(), rtol=1e-9, atol=1e-14)
        assert np.abs(u_hat.grad.numpy()).max() > 0
    report = gradient_flow_report(model, x, y)
    for layer in report["modes"]["full"]["layers"]:
        assert layer["iterations"][0]["grad_norm_sum"] > 0
    assert report["config"]["model"]["recipe"] == recipe


@pytest.mark.slow
@pytest.mark.parametrize("routing", RECIPE_ROUTINGS)
def test_the_authors_recipe_learns_a_tiny_set_with_every_routing(routing):
    """20 Adam steps on 6 images (64 input capsules, so that EM's small lambda still moves the class
    scores): the loss at the final margin falls, the spread loss's margin schedule running meanwhile."""
    tc.manual_seed(1)
    model = CapsNet(routing=routing, recipe="authors", **dict(SMALL, primary_types=4, conv1_channels=8))
    optimizer = tc.optim.Adam(model.parameters(), lr=0.01)
    x, y = batch(6)

    def final_loss():
        position, model.training_position = model.training_position, None  # outside a run: the final margin
        with tc.no_grad():
            loss = model.loss(model(x, y), x, y).item()
        model.training_position = position
        return loss

    before = final_loss()
    for step in range(20):
        model.set_training_position(step, 4, 5)
        loss = model.loss(model(tc.tensor(x), y), x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert np.isfinite(loss.item())
    after = final_loss()
    assert after < 0.8 * before, (before, after)
