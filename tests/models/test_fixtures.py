"""The PyTorch oracle's answers stored in tests/oracles/fixtures.npz (made by tests/oracles/make_fixtures.py),
checked without PyTorch: a small CapsNet's forward, loss and every parameter gradient; every
optimizer configuration's 5-step trajectory; every scheduler's learning rates."""
import json

import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps import optim
from tinygrad_caps.models import CapsNet, capsule_loss
from tinygrad_caps.models.capsnet.decoders import FCDecoder

from paths import ORACLES

FIXTURES = np.load(ORACLES / "fixtures.npz")
META = json.loads(str(FIXTURES["meta"]))


def gradient_field(p):
    """The same field as make_fixtures.gradient_field (kept here so the test needs no PyTorch import)."""
    return 2.0 * (p - 1.5) + 0.3 * np.sin(3 * p)


def fixture_capsnet(iterations, gradient):
    config = META["capsnet_config"]
    model = CapsNet(routing_iterations=iterations, routing_gradient=gradient, **config)
    model.decoder = FCDecoder(config["num_classes"] * config["digit_dim"],
                              config["in_channels"] * config["image_size"] ** 2, hidden=tuple(META["decoder_hidden"]))
    model.to(dtype="float64")
    prefix = "capsnet/param/"
    state = {k[len(prefix):]: FIXTURES[k] for k in FIXTURES.files if k.startswith(prefix)}
    assert set(state) == {name for name, _ in model.named_parameters()}
    model.load_state_dict(state)
    return model


@pytest.mark.parametrize("iterations, gradient", [tuple(case) for case in META["routing_cases"]])
def test_capsnet_forward_loss_and_every_gradient_equal_the_stored_pytorch_values(iterations, gradient):
    model = fixture_capsnet(iterations, gradient)
    x, y = FIXTURES["capsnet/x"], FIXTURES["capsnet/y"]
    v, lengths, recon = model(x, y)
    loss = capsule_loss(lengths, recon, x, y)  # default weights: the fixture uses 0.0005, 0.9, 0.1, 0.5
    loss.backward()
    case = f"capsnet/{iterations}-{gradient}"
    tol = dict(rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(v.numpy(), FIXTURES[f"{case}/v"], **tol)
    np.testing.assert_allclose(lengths.numpy(), FIXTURES[f"{case}/lengths"], **tol)
    np.testing.assert_allclose(recon.numpy(), FIXTURES[f"{case}/reconstruction"], **tol)
    np.testing.assert_allclose(loss.item(), FIXTURES[f"{case}/loss"], **tol)
    for name, p in model.named_parameters():
        ref = FIXTURES[f"{case}/grad/{name}"]
        np.testing.assert_allclose(p.grad.numpy(), ref, rtol=1e-8, atol=1e-12 * max(np.abs(ref).max(), 1e-3),
                                   err_msg=f"gradient of {name}")


def test_capsnet_labels_as_a_tensor_or_a_list_mask_the_same_capsules():
    model = fixture_capsnet(3, "full")
    x, y = FIXTURES["capsnet/x"], FIXTURES["capsnet/y"]
    expected = FIXTURES["capsnet/3-full/reconstruction"]
    for labels in (tc.tensor(y), [int(k) for k in y]):
        _, _, recon = model(x, labels)
        np.testing.assert_allclose(recon.numpy(), expected, rtol=1e-9, atol=1e-13)


def test_the_stored_routing_cases_differ():
    """Guards the fixture: 3 iterations differ from 1, and detach from full, in the stored gradients."""
    name = "capsnet/{}/grad/digit.weight"
    one, full, detach = (FIXTURES[name.format(c)] for c in ("1-full", "3-full", "3-detach"))
    assert np.abs(one - full).max() > 1e-3 * np.abs(full).max()
    assert np.abs(full - detach).max() > 1e-3 * np.abs(full).max()


def optimizer_trajectory(name, kwargs, steps):
    p = tc.tensor(np.array(META["start"]), requires_grad=True)
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
    opt = getattr(optim, name)([p], **kwargs)
    path = [p.numpy().copy()]
    for _ in range(steps):
        p.grad = tc.tensor(gradient_field(p.numpy()))
        opt.step()
        path.append(p.numpy().copy())
    return np.stack(path)


@pytest.mark.parametrize("index", range(len(META["optimizers"])),
                         ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for n, kw in META["optimizers"]])
def test_optimizer_trajectory_equals_pytorch(index):
    name, kwargs = META["optimizers"][index]
    ours = optimizer_trajectory(name, kwargs, META["optimizer_steps"])
    np.testing.assert_allclose(ours, FIXTURES[f"optimizer/{index}"], rtol=1e-12, atol=1e-14)


def test_every_stored_optimizer_option_changes_the_trajectory():
    """Guards the fixture: each option (Nesterov, dampening, AMSGrad, decay) moves the 5-step path."""
    paths = {json.dumps(cfg): FIXTURES[f"optimizer/{i}"] for i, cfg in enumerate(META["optimizers"])}
    assert len({p.tobytes() for p in paths.values()}) == len(paths)
    amsgrad = [i for i, (_, kw) in enumerate(META["optimizers"]) if kw.get("amsgrad")]
    for i in amsgrad:
        name, kwargs = META["optimizers"][i]
        without = optimizer_trajectory(name, dict(kwargs, amsgrad=False), META["optimizer_steps"])
        assert np.abs(without - FIXTURES[f"optimizer/{i}"]).max() > 1e-6, "AMSGrad's maximum must matter here"


@pytest.mark.parametrize("index", range(len(META["schedulers"])),
                         ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for n, kw in META["schedulers"]])
def test_scheduler_learning_rates_equal_pytorch(index):
    name, kwargs = META["schedulers"][index]
    opt = optim.SGD([tc.tensor(np.zeros(1), requires_grad=True)], lr=1.0)
    sched = getattr(optim, name)(opt, **kwargs)
    lrs = []
    for metric in META["metrics"]:
        sched.step(metric) if name == "ReduceLROnPlateau" else sched.step()
        lrs.append(opt.lr)
    np.testing.assert_allclose(lrs, FIXTURES[f"scheduler/{index}"], rtol=1e-12, atol=0)


def test_the_generator_reproduces_the_stored_fixtures():
    """Where PyTorch is installed: tests/oracles/make_fixtures.py --check regenerates every array and compares."""
    pytest.importorskip("torch")
    import importlib.util

    path = ORACLES / "make_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0
