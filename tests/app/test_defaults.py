"""Defaults are API: the README's "Defaults" tables equal the code's signatures, and calling each
function with its defaults gives the values those defaults imply (checked against plain NumPy)."""
import ast
import inspect
import re

import numpy as np
import pytest

import tinygrad_caps as tc
from paths import ROOT
from reference_routing import route
from tinygrad_caps import functional as F
from tinygrad_caps import optim
from tinygrad_caps.models import CapsNet, capsule_loss, dynamic_routing, margin_loss
from tinygrad_caps.models.cli import make_parser

README = ROOT / "README.md"


def documented_defaults():
    """{"capsule_loss": {"reconstruction_weight": 0.0005, ...}, "tinygrad-caps train": {"--epochs": "30", ...}}."""
    text = README.read_text()
    section = re.search(r"^## Defaults\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## Defaults' section"
    table = {}
    for name, values in re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|$", section.group(1), re.M):
        if name.startswith("tinygrad-caps"):
            table[name] = dict(item.split(" ", 1) for item in values.split(", "))
        else:
            call = ast.parse(f"f({values})", mode="eval").body
            table[name] = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    # CapsNet's keywords: the table of CapsNetConfig's fields (option | field | default | ...)
    options = re.search(r"^\| option \| `CapsNetConfig` field \|.*?\n\n", section.group(1), re.S | re.M)
    assert options, "README.md has no table of CapsNetConfig's fields in its 'Defaults' section"
    table["CapsNet"] = {field: ast.literal_eval(default)
                        for field, default in re.findall(r"^\| [^|]+ \| `(\w+)` \| `([^`]+)` \|", options.group(0), re.M)}
    return table


DOCUMENTED = documented_defaults()
FUNCTIONS = {"capsule_loss": capsule_loss, "margin_loss": margin_loss, "dynamic_routing": dynamic_routing,
             "CapsNet": CapsNet, "optim.SGD": optim.SGD, "optim.Adam": optim.Adam, "optim.AdamW": optim.AdamW,
             "optim.StepLR": optim.StepLR, "optim.ReduceLROnPlateau": optim.ReduceLROnPlateau}


def test_the_readme_documents_every_function_checked_here():
    assert set(FUNCTIONS) | {"tinygrad-caps train"} == set(DOCUMENTED)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_signature_defaults_equal_the_readme(name):
    parameters = inspect.signature(FUNCTIONS[name]).parameters
    for arg, value in DOCUMENTED[name].items():
        assert arg in parameters, f"{name} has no argument {arg}"
        actual = parameters[arg].default
        assert actual == value and type(actual) in (type(value), int, float), f"{name}({arg}={actual!r}), README {value!r}"


def test_cli_train_defaults_equal_the_readme():
    args = vars(make_parser().parse_args(["train"]))
    for flag, text in DOCUMENTED["tinygrad-caps train"].items():
        actual = args[flag.lstrip("-").replace("-", "_")]
        assert actual == type(actual)(text), f"train {flag} defaults to {actual!r}, README says {text}"


def numpy_margin(lengths, labels, m_plus, m_minus, down_weight):
    target = np.eye(lengths.shape[1])[labels]
    return (target * np.maximum(0, m_plus - lengths) ** 2
            + down_weight * (1 - target) * np.maximum(0, lengths - m_minus) ** 2).sum(axis=1)


def loss_inputs():
    rng = np.random.default_rng(4)
    lengths = rng.uniform(0.0, 1.0, (5, 4))
    lengths[0, :] = [0.05, 0.95, 0.5, 0.12]  # on both sides of both margins
    labels = np.array([1, 0, 3, 2, 2])
    return lengths, labels, 3 * rng.random((5, 100)), rng.random((5, 1, 10, 10))


def test_margin_loss_with_defaults():
    lengths, labels, _, _ = loss_inputs()
    d = DOCUMENTED["margin_loss"]
    ours = margin_loss(tc.tensor(lengths), labels).numpy()
    np.testing.assert_allclose(ours, numpy_margin(lengths, labels, d["m_plus"], d["m_minus"], d["down_weight"]), rtol=1e-13)


def test_capsule_loss_with_defaults():
    lengths, labels, recon, images = loss_inputs()
    d = DOCUMENTED["capsule_loss"]
    ours = capsule_loss(tc.tensor(lengths), tc.tensor(recon), images, labels).item()
    margin = numpy_margin(lengths, labels, d["m_plus"], d["m_minus"], d["down_weight"])
    squared = ((recon - images.reshape(5, -1)) ** 2).sum(axis=1)
    assert ours == pytest.approx((margin + d["reconstruction_weight"] * squared).mean(), rel=1e-13)
    assert squared.mean() * d["reconstruction_weight"] > 1e-3, "the reconstruction term must show in the total"


def test_dynamic_routing_with_defaults():
    u_hat = np.random.default_rng(5).standard_normal((2, 4, 3, 2))
    v = dynamic_routing(tc.tensor(u_hat))
    assert isinstance(v, tc.Tensor)
    ref, _ = route(u_hat, DOCUMENTED["dynamic_routing"]["iterations"])
    np.testing.assert_allclose(v.numpy(), ref, rtol=1e-12)


def test_capsnet_with_defaults_is_the_papers_network():
    d = DOCUMENTED["CapsNet"]
    tc.manual_seed(0)
    model = CapsNet()
    k, size = d["kernel_size"], d["image_size"]
    primary_size = ((size - k + 1) - k) // 2 + 1
    num_primary = d["primary_types"] * primary_size ** 2
    pixels = d["in_channels"] * size * size
    shapes = {name: p.shape for name, p in model.named_parameters()}
    assert shapes == {
        "conv1.weight": (d["conv1_channels"], d["in_channels"], k, k), "conv1.bias": (d["conv1_channels"],),
        "primary.weight": (d["primary_types"] * d["primary_dim"], d["conv1_channels"], k, k),
        "primary.bias": (d["primary_types"] * d["primary_dim"],),
        "digit.weight": (num_primary, d["num_classes"], d["digit_dim"], d["primary_dim"]),
        "decoder.fc1.weight": (512, d["num_classes"] * d["digit_dim"]), "decoder.fc1.bias": (512,),
        "decoder.fc2.weight": (1024, 512), "decoder.fc2.bias": (1024,),
        "decoder.fc3.weight": (pixels, 1024), "decoder.fc3.bias": (pixels,),
    }
    assert num_primary == 1152 and pixels == 784  # the paper's numbers
    # The default routing (3 iterations, gradient through all) on the model's own predictions.
    model.to(dtype="float64")
    model.digit.weight.data = model.digit.weight.data * 30  # routing far from uniform
    x = np.random.default_rng(6).random((1, 1, size, size))
    v, lengths, recon = model(x)
    u = model.primary(F.relu(model.conv1(tc.tensor(x))))
    u_hat = F.capsule_predict(u, model.digit.weight).numpy()
    ref_v, couplings = route(u_hat, d["routing_iterations"])
    assert np.abs(couplings[-1] - 1 / d["num_classes"]).max() > 1e-3
    np.testing.assert_allclose(v.numpy(), ref_v, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(lengths.numpy(), np.sqrt((ref_v ** 2).sum(-1) + 1e-8), rtol=1e-10)
    assert recon.shape == (1, pixels)


def run_default(optimizer_class, steps=3):
    """The parameter after ``steps`` steps of ``optimizer_class`` with its defaults (gradient (1, -0.5) * t + p)."""
    p = tc.tensor(np.array([0.5, -2.0]), requires_grad=True)
    opt = optimizer_class([p])
    for t in range(steps):
        p.grad = tc.tensor(np.array([1.0, -0.5]) * (t + 1) + p.numpy())
        opt.step()
    return p.numpy()


def numpy_adam(steps, lr, betas, eps, weight_decay, decoupled):
    p = np.array([0.5, -2.0])
    m = np.zeros(2)
    v = np.zeros(2)
    for t in range(1, steps + 1):
        g = np.array([1.0, -0.5]) * t + p
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        p = p - lr * (m / (1 - betas[0] ** t)) / (np.sqrt(v / (1 - betas[1] ** t)) + eps)
    return p


def test_sgd_with_defaults_is_plain_gradient_descent():
    ours = run_default(optim.SGD, steps=2)
    lr = DOCUMENTED["optim.SGD"]["lr"]
    p = np.array([0.5, -2.0])
    for t in range(2):
        p = p - lr * (np.array([1.0, -0.5]) * (t + 1) + p)
    np.testing.assert_allclose(ours, p, rtol=1e-14)


@pytest.mark.parametrize("name, decoupled", [("optim.Adam", False), ("optim.AdamW", True)])
def test_adam_and_adamw_with_defaults(name, decoupled):
    d = DOCUMENTED[name]
    ours = run_default(FUNCTIONS[name], steps=3)
    ref = numpy_adam(3, d["lr"], d["betas"], d["eps"], d["weight_decay"], decoupled)
    np.testing.assert_allclose(ours, ref, rtol=1e-13)


def test_step_lr_with_the_default_gamma():
    opt = optim.SGD([tc.tensor(np.zeros(1), requires_grad=True)], lr=1.0)
    sched = optim.StepLR(opt, step_size=2)
    rates = []
    for _ in range(4):
        sched.step()
        rates.append(opt.lr)
    gamma = DOCUMENTED["optim.StepLR"]["gamma"]
    np.testing.assert_allclose(rates, [1.0, gamma, gamma, gamma ** 2], rtol=1e-15)


def test_reduce_lr_on_plateau_with_defaults_waits_patience_epochs():
    d = DOCUMENTED["optim.ReduceLROnPlateau"]
    opt = optim.SGD([tc.tensor(np.zeros(1), requires_grad=True)], lr=1.0)
    sched = optim.ReduceLROnPlateau(opt)
    rates = []
    for _ in range(d["patience"] + 2):
        sched.step(1.0)  # never improves after the first epoch
        rates.append(opt.lr)
    assert rates[:d["patience"] + 1] == [1.0] * (d["patience"] + 1)
    assert rates[-1] == pytest.approx(d["factor"])


@pytest.mark.parametrize("pixels", [99, 101])
def test_capsule_loss_rejects_a_reconstruction_of_another_size(pixels):
    lengths, labels, _, images = loss_inputs()
    with pytest.raises(ValueError, match="^reconstruction_loss: "):
        capsule_loss(tc.tensor(lengths), tc.tensor(np.zeros((5, pixels))), images, labels)


def test_every_train_option_is_documented():
    """Each option of ``train`` appears in the README's tables or in docs/training.md's."""
    text = README.read_text() + (ROOT / "docs" / "training.md").read_text()
    train = next(a for a in make_parser()._subparsers._group_actions if a.dest == "command").choices["train"]
    for action in train._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag != "--help":
                assert f"`{flag}" in text, f"train {flag} is documented neither in README.md nor in docs/training.md"
