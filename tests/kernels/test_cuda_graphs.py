"""Capturing a training step as a CUDA graph (tinygrad_caps.cuda_graphs), the capturable Adam and
cuBLAS through kernels.gemm: what the CPU can check, the stand-in runs (capture rules, a captured
CapsNet training equal to the eager one), and the same on a real GPU."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.cuda_graphs import CapturedStep, capture_unavailable_reason
from tinygrad_caps.kernels import launch
from tinygrad_caps.kernels.checking.emulation import Emulator

from paths import SUPPORT
from standin import run_standin


def test_capture_needs_a_gpu_and_says_so():
    assert "GPU" in capture_unavailable_reason("cpu")
    with pytest.raises(ValueError, match="on a GPU"):
        CapturedStep(lambda: None, [tc.zeros(2, device="cpu")])


def test_matmul_precision_is_checked_and_kept():
    assert tc.get_matmul_precision() == "highest"
    with pytest.raises(ValueError, match="precision"):
        tc.set_matmul_precision("medium")
    tc.set_matmul_precision("high")
    try:
        assert tc.get_matmul_precision() == "high"
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        assert (tc.tensor(x) @ tc.tensor(x.T)).numpy().tolist() == (x @ x.T).tolist()  # the CPU is not affected
    finally:
        tc.set_matmul_precision("highest")


@pytest.mark.parametrize("amsgrad, weight_decay, decoupled", [(False, 0.0, False), (True, 0.01, False),
                                                              (False, 0.01, True)])
def test_capturable_adam_equals_adam_bit_for_bit_and_follows_lr_changes(amsgrad, weight_decay, decoupled):
    """On the kernels' CPU emulation: the rate and the step counts read on the device give exactly the
    host's update, a changed ``lr`` is followed, and ``state_dict`` reads the counts back."""
    rng = np.random.default_rng(0)
    start = [rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)]
    grads = [[rng.standard_normal(p.shape).astype(np.float32) for p in start] for _ in range(4)]
    kind = tc.optim.AdamW if decoupled else tc.optim.Adam
    results = []
    with launch.run_numpy_arrays_with(Emulator()):
        for capturable in (False, True):
            params = [tc.tensor(p.copy(), requires_grad=True) for p in start]
            optimizer = kind(params, lr=1e-2, amsgrad=amsgrad, weight_decay=weight_decay, capturable=capturable)
            for k, step_grads in enumerate(grads):
                if k == 2:
                    optimizer.lr = 3e-3
                for p, g in zip(params, step_grads):
                    p.grad = tc.tensor(g)
                optimizer.step()
            results.append(([p.numpy() for p in params], optimizer.state_dict()))
    (host, host_state), (device, device_state) = results
    for a, b in zip(host, device):
        assert np.array_equal(a, b)
    assert [s["step"] for s in device_state["state"].values()] == [4, 4]
    assert [s["step"] for s in host_state["state"].values()] == [4, 4]


def test_capturable_adam_resumes_from_a_state_dict():
    rng = np.random.default_rng(1)
    with launch.run_numpy_arrays_with(Emulator()):
        params = [tc.tensor(rng.standard_normal(3).astype(np.float32), requires_grad=True)]
        optimizer = tc.optim.Adam(params, lr=1e-2, capturable=True)
        for _ in range(3):
            params[0].grad = tc.tensor(np.ones(3, np.float32))
            optimizer.step()
        saved = optimizer.state_dict()
        assert saved["state"]["0"]["step"] == 3
        optimizer.load_state_dict(dict(saved, state={"0": dict(saved["state"]["0"], step=7)}))
        params[0].grad = tc.tensor(np.ones(3, np.float32))
        optimizer.step()
        assert optimizer.state_dict()["state"]["0"]["step"] == 8


def test_adam_restores_its_state_into_the_arrays_a_graph_reads():
    rng = np.random.default_rng(2)
    with launch.run_numpy_arrays_with(Emulator()):
        params = [tc.tensor(rng.standard_normal(3).astype(np.float32), requires_grad=True)]
        optimizer = tc.optim.Adam(params, lr=1e-2, capturable=True)
        params[0].grad = tc.tensor(np.ones(3, np.float32))
        optimizer.step()
        arrays = {key: optimizer.state[0][key] for key in ("exp_avg", "exp_avg_sq")}
        rates = optimizer._device_counters()
        saved = optimizer.state_dict()
        saved["state"]["0"] = dict(saved["state"]["0"], exp_avg=np.full(3, 0.5, np.float32), step=5)
        optimizer.load_state_dict(dict(saved, hyperparameters=dict(saved["hyperparameters"], lr=3e-3)))
        for key, array in arrays.items():
            assert optimizer.state[0][key] is array
        np.testing.assert_array_equal(arrays["exp_avg"], np.full(3, 0.5, np.float32))
        assert all(now is before for now, before in zip(optimizer._device_counters(), rates))
        assert float(rates[0][()] if rates[0].ndim == 0 else rates[0][0]) == np.float32(3e-3)


def test_capturable_adam_needs_the_fused_kernel():
    params = [tc.tensor(np.ones(3, np.float32), requires_grad=True)]
    optimizer = tc.optim.Adam(params, capturable=True)
    params[0].grad = tc.tensor(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="capturable"):
        optimizer.step()


def test_the_stand_in_follows_cudas_capture_rules_and_gemm_layouts():
    output = run_standin([str(SUPPORT / "standin_scenarios.py"), "capture_follows_cuda_rules,gemm_layouts_and_precision"])
    assert output.split() == ["ok", "ok"]


@pytest.mark.slow
def test_a_captured_capsnet_training_equals_the_eager_one_on_the_stand_in():
    assert run_standin([str(SUPPORT / "standin_scenarios.py"), "captured_training_equals_eager"]).split() == ["ok"]


@pytest.mark.gpu
def test_a_captured_capsnet_training_equals_the_eager_one_on_the_gpu():
    """Fifty steps of the paper's CapsNet (B=16), captured against eager: losses and weights to 1e-6."""
    from capsnet_steps import capsnet_training

    rng = np.random.default_rng(0)
    batches = [(rng.random((16, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 16)) for _ in range(4)]
    eager_losses, eager_weights, _, _ = capsnet_training(batches, 50, captured=False, lr_change=(25, 3e-4))
    losses, weights, _, _ = capsnet_training(batches, 50, captured=True, lr_change=(25, 3e-4))
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-6)
    for name, w in eager_weights.items():
        np.testing.assert_allclose(weights[name], w, rtol=1e-6, atol=1e-6 * float(np.abs(w).max()), err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_gemm_equals_cupy_matmul_on_every_layout(precision):
    import cupy
    from tinygrad_caps.kernels import gemm

    rng = np.random.default_rng(0)
    a, b = cupy.asarray(rng.standard_normal((300, 200), dtype=np.float32)), cupy.asarray(
        rng.standard_normal((200, 100), dtype=np.float32))
    gemm.set_precision(precision)
    try:
        tolerance = 1e-5 if precision == "highest" else 2e-2
        for x, y in ((a, b), (cupy.ascontiguousarray(a.T).T, b), (a, cupy.ascontiguousarray(b.T).T), (a[::2], b)):
            want = cupy.matmul(x.astype(cupy.float64), y.astype(cupy.float64))
            np.testing.assert_allclose(gemm.matmul(x, y).get(), want.get(), rtol=tolerance, atol=tolerance * 20)
        batched = cupy.asarray(rng.standard_normal((4, 30, 20))), cupy.asarray(rng.standard_normal((4, 20, 10)))
        np.testing.assert_allclose(gemm.matmul(*batched).get(), cupy.matmul(*batched).get(), rtol=1e-12)
    finally:
        gemm.set_precision("highest")
