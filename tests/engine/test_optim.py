"""Optimizers and schedulers: the same trajectories as PyTorch's, and state that round-trips."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps import optim


def quadratic_grad(p):
    return 2.0 * (p - 1.5) + 0.3 * np.sin(3 * p)


def run_ours(make, steps=25):
    p = tc.tensor(np.array([0.3, -1.2, 2.0]), requires_grad=True)
    opt = make([p])
    for _ in range(steps):
        p.grad = tc.tensor(quadratic_grad(p.numpy()))
        opt.step()
    return p.numpy(), opt


def run_torch(torch, make, steps=25):
    p = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64, requires_grad=True)
    opt = make([p])
    for _ in range(steps):
        p.grad = torch.from_numpy(quadratic_grad(p.detach().numpy()))
        opt.step()
    return p.detach().numpy()


CONFIGS = [
    ("SGD", dict(lr=0.05)),
    ("SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.05, momentum=0.5, dampening=0.3)),
    ("Adam", dict(lr=0.1)),
    ("Adam", dict(lr=0.1, betas=(0.8, 0.99), weight_decay=0.05, amsgrad=True)),
    ("AdamW", dict(lr=0.1, weight_decay=0.1)),
]


@pytest.mark.parametrize("name, kwargs", CONFIGS)
def test_optimizer_matches_pytorch(name, kwargs):
    torch = pytest.importorskip("torch")
    ours, _ = run_ours(lambda ps: getattr(optim, name)(ps, **kwargs))
    ref = run_torch(torch, lambda ps: getattr(torch.optim, name)(ps, **kwargs))
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-14)


def test_adam_first_step_is_lr_times_sign():
    """With bias correction, Adam's first step is lr * g / (|g| + eps): about lr in each coordinate."""
    p = tc.tensor(np.array([1.0, -1.0]), requires_grad=True)
    opt = optim.Adam([p], lr=0.01)
    p.grad = tc.tensor(np.array([3.0, -0.5]))
    opt.step()
    np.testing.assert_allclose(p.numpy(), [0.99, -0.99], rtol=1e-6)


def test_optimizer_state_dict_round_trip_continues_identically(tmp_path):
    p_full, opt_full = run_ours(lambda ps: optim.Adam(ps, lr=0.1), steps=10)
    p_half, opt_half = run_ours(lambda ps: optim.Adam(ps, lr=0.1), steps=5)
    tc.save(opt_half.state_dict(), tmp_path / "opt.npz")
    q = tc.tensor(p_half, requires_grad=True)
    opt = optim.Adam([q], lr=0.5)
    opt.load_state_dict(tc.load(tmp_path / "opt.npz"))
    assert opt.lr == 0.1
    for _ in range(5):
        q.grad = tc.tensor(quadratic_grad(q.numpy()))
        opt.step()
    np.testing.assert_allclose(q.numpy(), p_full, rtol=1e-14)


def test_schedulers_follow_pytorch():
    torch = pytest.importorskip("torch")
    metrics = [1.0, 0.9, 0.95, 0.96, 0.97, 0.97, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6]
    cases = [
        (lambda o: optim.ExponentialLR(o, 0.9), lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.9), False),
        (lambda o: optim.StepLR(o, 3, 0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5), False),
        (lambda o: optim.ReduceLROnPlateau(o, factor=0.5, patience=2, cooldown=1),
         lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=2, cooldown=1), True),
    ]
    for ours_make, ref_make, with_metric in cases:
        ours_opt = optim.SGD([tc.tensor(np.zeros(1), requires_grad=True)], lr=1.0)
        ref_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        ours, ref = ours_make(ours_opt), ref_make(ref_opt)
        for m in metrics:
            ref_opt.step()
            if with_metric:
                ours.step(m)
                ref.step(m)
            else:
                ours.step()
                ref.step()
            assert ours_opt.lr == pytest.approx(ref_opt.param_groups[0]["lr"], rel=1e-12)


def test_scheduler_state_round_trip():
    opt = optim.SGD([tc.tensor(np.zeros(1), requires_grad=True)], lr=1.0)
    sched = optim.StepLR(opt, 2, 0.1)
    for _ in range(3):
        sched.step()
    other = optim.StepLR(optim.SGD([tc.tensor(np.zeros(1), requires_grad=True)], lr=1.0), 5, 0.9)
    other.load_state_dict(sched.state_dict())
    other.step()
    sched.step()
    assert other.optimizer.lr == pytest.approx(opt.lr)


def test_bad_optimizer_arguments():
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="requires grad"):
        optim.Adam([tc.tensor(np.zeros(2))])


def test_param_groups_view_reads_and_writes_hyperparameters():
    p = tc.tensor(np.zeros(2), requires_grad=True)
    opt = optim.Adam([p], lr=0.1)
    group = opt.param_groups[0]
    assert group["lr"] == 0.1 and group["params"] == [p] and group["betas"] == (0.9, 0.999)
    group["lr"] = 0.05
    assert opt.lr == 0.05
