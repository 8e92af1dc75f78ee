"""Properties of the tape: accumulation, reuse, no_grad, freeing, long chains, hooks, anomalies."""
import gc
import weakref

import numpy as np
import pytest
from hypothesis import given

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from helpers import arrays, shapes


@given(x=shapes(min_side=1).flatmap(arrays))
def test_gradient_of_a_sum_of_functions_is_the_sum_of_gradients(x):
    f = lambda t: F.tanh(t) * t  # noqa: E731
    g = lambda t: F.exp(t * 0.5)  # noqa: E731
    a = tc.tensor(x, requires_grad=True)
    (gf,) = tc.grad(F.sum(f(a)), a)
    (gg,) = tc.grad(F.sum(g(a)), a)
    (both,) = tc.grad(F.sum(f(a) + g(a)), a)
    np.testing.assert_allclose(both.numpy(), gf.numpy() + gg.numpy(), rtol=1e-12, atol=1e-12)


def test_backward_accumulates_into_grad_across_calls():
    x = tc.tensor(np.array([1.0, 2.0]), requires_grad=True)
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0 + 3.0, 4.0 + 3.0])


def test_tensor_reused_in_a_loop_accumulates_every_use():
    """The routing pattern: one tensor read in every iteration of a loop."""
    u = tc.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
    b = tc.tensor(np.zeros(3))
    for _ in range(3):
        c = F.softmax(b, axis=0)
        v = F.tanh((c * u).sum())
        b = b + u * v
    b.sum().backward()
    eps, base = 1e-6, u.numpy()

    def value(arr):
        bb = np.zeros(3)
        for _ in range(3):
            c = np.exp(bb) / np.exp(bb).sum()
            v = np.tanh((c * arr).sum())
            bb = bb + arr * v
        return bb.sum()

    numeric = [(value(base + eps * e) - value(base - eps * e)) / (2 * eps) for e in np.eye(3)]
    np.testing.assert_allclose(u.grad.numpy(), numeric, rtol=1e-6)


def test_no_grad_records_nothing_and_enable_grad_reopens():
    x = tc.tensor(np.ones(3), requires_grad=True)
    with tc.no_grad():
        y = x * 2.0
        with tc.enable_grad():
            z = x * 2.0
    assert y.creator is None and not y.requires_grad
    assert z.creator is not None and z.requires_grad

    @tc.no_grad()
    def double(t):
        return t * 2.0

    assert double(x).creator is None
    assert tc.is_grad_enabled()


def test_dropping_the_output_frees_the_graph():
    x = tc.tensor(np.ones(3), requires_grad=True)
    y = (x * 2.0).exp()
    node = weakref.ref(y.creator)
    inner = weakref.ref(y.creator.next[0])  # the node that made exp's input
    del y
    gc.collect()
    assert node() is None and inner() is None


def test_backward_frees_the_graph_and_a_second_backward_raises():
    x = tc.tensor(np.ones(3), requires_grad=True)
    h = x.exp()
    y = (h * h).sum()
    saved = weakref.ref(h)
    y.backward()
    del h
    gc.collect()
    assert saved() is None  # the intermediate is no longer held by the graph
    with pytest.raises(tc.GraphError, match="freed"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = tc.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 8.0])


def test_a_chain_of_20000_ops_needs_no_recursion():
    # 20 times Python's default recursion limit: a recursive walk would fail long before the end
    x = tc.tensor(np.array([1.0]), requires_grad=True)
    y = x
    for _ in range(20_000):
        y = y * 1.0
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0])
    del y
    gc.collect()


def test_register_hook_sees_and_replaces_the_gradient_in_a_loop():
    x = tc.tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x * 1.0
    seen = []
    h.register_hook(lambda g: seen.append(g.numpy().copy()))
    h.register_hook(lambda g: g * 10.0)
    total = tc.tensor(np.zeros(2))
    for k in range(3):
        total = total + h * float(k + 1)
    total.sum().backward()
    np.testing.assert_allclose(seen[0], [6.0, 6.0])  # one call with the summed gradient of all three uses
    np.testing.assert_allclose(x.grad.numpy(), [60.0, 60.0])


def test_hook_on_a_leaf_and_its_removal():
    x = tc.tensor(np.array([1.0, 2.0]), requires_grad=True)
    handle = x.register_hook(lambda g: g * 0.0)
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0])
    handle.remove()
    x.grad = None
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def test_retain_grad_keeps_grad_on_a_non_leaf():
    x = tc.tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x * x
    h.retain_grad()
    other = x * 2.0
    (h * 3.0).sum().backward()
    np.testing.assert_allclose(h.grad.numpy(), [3.0, 3.0])
    assert other.grad is None


def test_grad_does_not_touch_dot_grad_and_handles_intermediate_inputs():
    x = tc.tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x * x
    y = (h * 3.0).sum()
    gh, gx = tc.grad(y, [h, x])
    np.testing.assert_allclose(gh.numpy(), [3.0, 3.0])
    np.testing.assert_allclose(gx.numpy(), [6.0, 12.0])
    assert x.grad is None and h.grad is None


def test_grad_allow_unused():
    x = tc.tensor(np.ones(2), requires_grad=True)
    z = tc.tensor(np.ones(2), requires_grad=True)
    y = (x * 2.0).sum()
    with pytest.raises(tc.GraphError, match="allow_unused"):
        tc.grad(y, [x, z], retain_graph=True)
    gx, gz = tc.grad(y, [x, z], allow_unused=True)
    assert gz is None and gx is not None


def test_hessian_vector_product():
    a = np.array([[2.0, 1.0], [1.0, 3.0]])
    x = tc.tensor(np.array([1.0, -1.0]), requires_grad=True)
    y = (x * F.matmul(tc.tensor(a), x)).sum() * 0.5 + (x ** 3).sum()
    (g,) = tc.grad(y, x, create_graph=True)
    v = np.array([0.3, 0.7])
    (hv,) = tc.grad((g * tc.tensor(v)).sum(), x)
    hessian = a + np.diag(6 * x.numpy())
    np.testing.assert_allclose(hv.numpy(), hessian @ v, rtol=1e-12)


def test_third_derivative():
    x = tc.tensor(np.array([0.7]), requires_grad=True)
    y = F.exp(x * 2.0).sum()
    (g1,) = tc.grad(y, x, create_graph=True)
    (g2,) = tc.grad(g1.sum(), x, create_graph=True)
    (g3,) = tc.grad(g2.sum(), x)
    np.testing.assert_allclose(g3.numpy(), 8 * np.exp(1.4), rtol=1e-12)


def test_gradient_penalty_backward_with_create_graph():
    w = tc.tensor(np.array([0.5, -0.2]), requires_grad=True)
    x = tc.tensor(np.array([1.0, 2.0]), requires_grad=True)
    out = F.tanh((w * x).sum())
    (gx,) = tc.grad(out, x, create_graph=True)
    (gx * gx).sum().backward()
    assert w.grad is not None and np.all(np.isfinite(w.grad.numpy()))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_detect_anomaly_names_the_op_shapes_and_line_in_forward():
    x = tc.tensor(np.array([1.0, -1.0]), requires_grad=True)
    with tc.detect_anomaly():
        with pytest.raises(tc.AnomalyError) as info:
            F.log(x * 1.0).sqrt()
    message = str(info.value)
    assert "op Log" in message and "(2,)" in message and "test_tape.py" in message


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
def test_detect_anomaly_catches_nan_in_backward():
    x = tc.tensor(np.array([0.0, 1.0]), requires_grad=True)
    with tc.detect_anomaly():
        y = F.sqrt(x).sum()
        with pytest.raises(tc.AnomalyError, match="Sqrt.*backward"):
            y.backward()
