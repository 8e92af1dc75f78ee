"""Optimizer and scheduler arguments at their boundaries (valid ones accepted, invalid ones a clear
ValueError), state that round-trips through state_dict, and the schedulers' less travelled rules."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps import optim


def param(values=(0.5, -1.0)):
    return tc.tensor(np.array(values), requires_grad=True)


@pytest.mark.parametrize("make", [
    lambda p: optim.SGD([p], lr=-0.1),
    lambda p: optim.Adam([p], lr=-1e-3),
    lambda p: optim.SGD([p], lr=0.1, nesterov=True),
    lambda p: optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.1, nesterov=True),
    lambda p: optim.Adam([p], betas=(1.0, 0.9)),
    lambda p: optim.Adam([p], betas=(0.9, 1.0)),
    lambda p: optim.Adam([p], betas=(-0.1, 0.9)),
    lambda p: optim.AdamW([p], betas=(0.9, -0.5)),
    lambda p: optim.StepLR(optim.SGD([p], lr=0.1), step_size=0),
    lambda p: optim.ReduceLROnPlateau(optim.SGD([p], lr=0.1), factor=1.0),
    lambda p: optim.ReduceLROnPlateau(optim.SGD([p], lr=0.1), mode="up"),
    lambda p: optim.ReduceLROnPlateau(optim.SGD([p], lr=0.1), threshold_mode="relative"),
])
def test_invalid_arguments_raise(make):
    with pytest.raises(ValueError):
        make(param())


@pytest.mark.parametrize("make", [
    lambda p: optim.SGD([p], lr=0.0),
    lambda p: optim.SGD([p], lr=0.1, momentum=0.5, nesterov=True),
    lambda p: optim.Adam([p], betas=(0.0, 0.0)),
    lambda p: optim.Adam([p], lr=0.0),
    lambda p: optim.StepLR(optim.SGD([p], lr=0.1), step_size=1),
    lambda p: optim.ReduceLROnPlateau(optim.SGD([p], lr=0.1), factor=0.99),
])
def test_boundary_arguments_are_accepted(make):
    make(param())


def test_a_parameter_listed_twice_is_updated_once():
    p = param()
    opt = optim.SGD([p, p], lr=0.5)
    assert len(opt.params) == 1
    p.grad = tc.tensor(np.array([1.0, 1.0]))
    opt.step()
    np.testing.assert_allclose(p.numpy(), [0.0, -1.5])


def test_step_skips_parameters_without_gradient_and_zero_grad_clears():
    p, q = param(), param((2.0, 3.0))
    opt = optim.Adam([p, q], lr=0.1)
    p.grad = tc.tensor(np.array([1.0, -1.0]))
    opt.step()
    np.testing.assert_array_equal(q.numpy(), [2.0, 3.0])
    assert "step" not in opt.state[1] and opt.state[0]["step"] == 1
    opt.zero_grad()
    assert p.grad is None and q.grad is None


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    lambda ps: optim.Adam(ps, lr=0.1, betas=(0.8, 0.5), amsgrad=True, weight_decay=0.1),
    lambda ps: optim.AdamW(ps, lr=0.1),
])
def test_state_dict_round_trip_continues_identically(make, tmp_path):
    def grad(p):
        return 2 * p + np.cos(3 * p)

    p_full = param()
    full = make([p_full])
    p_half = param()
    half = make([p_half])
    for step in range(6):
        p_full.grad = tc.tensor(grad(p_full.numpy()))
        full.step()
        if step < 3:
            p_half.grad = tc.tensor(grad(p_half.numpy()))
            half.step()
    tc.save(half.state_dict(), tmp_path / "opt.npz")
    q = tc.tensor(p_half.numpy(), requires_grad=True)
    resumed = make([q])
    resumed.lr = 123.0
    resumed.load_state_dict(tc.load(tmp_path / "opt.npz"))
    assert resumed.lr == 0.1
    for _ in range(3):
        q.grad = tc.tensor(grad(q.numpy()))
        resumed.step()
    np.testing.assert_allclose(q.numpy(), p_full.numpy(), rtol=1e-14)


def test_load_state_dict_rejects_other_shapes_and_counts():
    opt = optim.Adam([param()], lr=0.1)
    p = param()
    p.grad = tc.tensor(np.ones(2))
    other = optim.Adam([p], lr=0.1)
    other.step()
    state = other.state_dict()
    state["state"]["0"]["exp_avg"] = np.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(state)
    with pytest.raises(ValueError, match="2 saved parameter states"):
        opt.load_state_dict({"hyperparameters": {}, "state": {"0": {}, "1": {}}})


def test_param_groups_reject_unknown_keys():
    group = optim.SGD([param()], lr=0.1).param_groups[0]
    assert set(group.keys()) == {"params", "lr", "momentum", "dampening", "nesterov", "weight_decay"}
    with pytest.raises(KeyError):
        group["betas"]
    with pytest.raises(KeyError):
        group["betas"] = (0.9, 0.99)


def plateau_rates(metrics, **kwargs):
    opt = optim.SGD([param()], lr=1.0)
    sched = optim.ReduceLROnPlateau(opt, **kwargs)
    rates = []
    for m in metrics:
        sched.step(m)
        rates.append(opt.lr)
    return rates


def test_plateau_threshold_modes_and_min_lr():
    # rel: 0.95 is not below 1.0 * (1 - 0.1): no improvement; abs: 0.95 > 1.0 - 0.01 is one
    assert plateau_rates([1.0, 0.95, 0.95], factor=0.5, patience=0, threshold=0.1) == [1.0, 0.5, 0.25]
    assert plateau_rates([1.0, 0.95, 0.95], factor=0.5, patience=0, threshold=0.01, threshold_mode="abs") == [1.0, 1.0, 0.5]
    assert plateau_rates([1.0, 2.0, 2.5, 2.5, 2.5], mode="max", factor=0.5, patience=1) == [1.0, 1.0, 1.0, 1.0, 0.5]
    # away from best = 1, where the two modes' bounds differ: rel 2.0 * 0.9 = 1.8, abs 2.0 - 0.1 = 1.9
    assert plateau_rates([2.0, 1.85, 1.85], factor=0.5, patience=0, threshold=0.1) == [1.0, 0.5, 0.25]
    assert plateau_rates([2.0, 1.85, 1.85], factor=0.5, patience=0, threshold=0.1, threshold_mode="abs") == [1.0, 1.0, 0.5]
    assert plateau_rates([2.0, 2.15, 2.15], mode="max", factor=0.5, patience=0, threshold=0.1) == [1.0, 0.5, 0.25]
    assert plateau_rates([2.0, 2.15, 2.15], mode="max", factor=0.5, patience=0, threshold=0.1,
                         threshold_mode="abs") == [1.0, 1.0, 0.5]
    # max with abs: 1.05 is not above 1.0 + 0.1, 1.2 is
    assert plateau_rates([1.0, 1.05, 1.2, 1.25], mode="max", factor=0.5, patience=0, threshold=0.1,
                         threshold_mode="abs") == [1.0, 0.5, 0.5, 0.25]
    assert plateau_rates([1.0] * 6, factor=0.5, patience=0, min_lr=0.2) == [1.0, 0.5, 0.25, 0.2, 0.2, 0.2]
    # a reduction smaller than eps is not applied
    assert plateau_rates([1.0] * 3, factor=0.5, patience=0, min_lr=0.9999999999) == [1.0] * 3
    # cooldown: no counting of bad epochs for `cooldown` epochs after a reduction
    assert plateau_rates([1.0] * 6, factor=0.5, patience=0, cooldown=2) == [1.0, 0.5, 0.5, 0.5, 0.25, 0.25]


def test_scheduler_get_last_lr_and_state():
    opt = optim.SGD([param()], lr=2.0)
    sched = optim.ExponentialLR(opt, gamma=0.5)
    sched.step()
    assert sched.get_last_lr() == 1.0 and sched.last_epoch == 1
    assert "optimizer" not in sched.state_dict()
    plateau = optim.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    plateau.step(1.0)
    plateau.step(1.0)
    assert plateau.get_last_lr() == 0.5
    restored = optim.ReduceLROnPlateau(optim.SGD([param()], lr=0.5), patience=0, factor=0.5)
    restored.load_state_dict({k: v for k, v in plateau.state_dict().items()})
    assert restored.best == 1.0 and restored.last_epoch == 2
