"""Engine semantics a PyTorch user relies on: grad mode, gradient dtype and ownership, in-place
updates and their detection, memory held by the graph, and the profiler."""
import gc
import threading
import weakref

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps.ops.activation import ReLU
from tinygrad_caps.ops.conv import Im2Col

from helpers import arrays, floats, shapes


# ----- 1. grad mode -----
def test_no_grad_decorator_on_a_recursive_function_restores_grad_mode():
    @tc.no_grad()
    def depth(n):
        assert not tc.is_grad_enabled()
        return 0 if n == 0 else 1 + depth(n - 1)

    assert depth(5) == 5
    assert tc.is_grad_enabled()


def test_grad_mode_is_restored_when_the_body_raises_and_when_nested():
    mode = tc.no_grad()
    with pytest.raises(RuntimeError):
        with mode:
            with tc.enable_grad():
                assert tc.is_grad_enabled()
                with mode:  # the same object entered twice
                    assert not tc.is_grad_enabled()
                    raise RuntimeError("boom")
    assert tc.is_grad_enabled()

    @tc.enable_grad()
    def inner():
        return tc.is_grad_enabled()

    with tc.no_grad():
        assert inner() is True
        assert not tc.is_grad_enabled()
    assert tc.is_grad_enabled()


def test_grad_and_anomaly_modes_are_thread_local():
    inside, seen_by_thread, release = threading.Event(), {}, threading.Event()

    def evaluate():
        seen_by_thread["start"] = (tc.is_grad_enabled(), tc.is_anomaly_enabled())
        with tc.no_grad():
            inside.set()
            release.wait(10)

    with tc.detect_anomaly():
        worker = threading.Thread(target=evaluate)
        worker.start()
        inside.wait(10)
        assert tc.is_grad_enabled()  # the other thread's no_grad does not leak here
        x = tc.tensor(np.ones(2), requires_grad=True)
        assert (x * 2.0).requires_grad
        release.set()
        worker.join(10)
    assert seen_by_thread["start"] == (True, False)  # a new thread: grad on, anomaly off


# ----- 2. gradient dtype and promotion -----
def test_promotion_follows_pytorch():
    f32 = tc.tensor(np.ones(3, np.float32), requires_grad=True)
    assert (f32 * 2.5).dtype == np.float32
    assert (2.5 * f32).dtype == np.float32
    assert (f32 * np.float64(2.0)).dtype == np.float32  # a NumPy scalar does not upcast a dimensioned tensor
    assert (tc.tensor(np.arange(3)) + 0.5).dtype == tc.get_default_dtype() == np.float32
    assert (tc.tensor(np.arange(3)) * 2).dtype == np.int64
    f64 = tc.tensor(np.ones(3), requires_grad=True)
    assert (f32 * f64).dtype == np.float64


@pytest.mark.parametrize("other", [np.full(3, 2.0), np.float64(2.0), "tensor64"])
def test_the_gradient_has_the_dtype_of_the_tensor_it_reaches(other):
    p = tc.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    q = tc.tensor(np.full(3, 2.0), requires_grad=True) if isinstance(other, str) else other
    F.sum(p * q * p).backward()
    assert p.grad.dtype == np.float32 and p.grad.shape == p.shape
    np.testing.assert_allclose(p.grad.numpy(), 4.0 * np.array([1.0, 2.0, 3.0]), rtol=1e-6)
    if isinstance(other, str):
        assert q.grad.dtype == np.float64


def test_grad_returns_the_inputs_dtype():
    p = tc.tensor(np.ones(2, np.float32), requires_grad=True)
    (g,) = tc.grad(F.sum(p * np.ones(2)), p)
    assert g.dtype == np.float32


# ----- 3. gradient ownership -----
def test_gradients_of_a_sum_do_not_share_an_array():
    p = tc.tensor(np.ones(3), requires_grad=True)
    q = tc.tensor(np.ones(3), requires_grad=True)
    w = tc.tensor(np.full(3, 2.0))
    F.sum((p + q) * w).backward()
    p.grad.data[...] = 0.0
    np.testing.assert_array_equal(q.grad.numpy(), [2.0, 2.0, 2.0])


def test_grad_of_a_full_sum_is_a_writeable_array_of_its_own():
    x = tc.tensor(np.ones((2, 3)), requires_grad=True)
    F.sum(x).backward()
    assert x.grad.data.flags.writeable and x.grad.data.base is None
    x.grad.data += 1.0
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 2.0))


def test_backward_does_not_mutate_the_seed_gradient_or_a_retained_gradient():
    x = tc.tensor(np.ones(3), requires_grad=True)
    y = x * 1.0
    y.retain_grad()
    z = y + x  # the same upstream gradient reaches y and x
    seed = np.array([1.0, 2.0, 3.0])
    z.backward(seed)
    np.testing.assert_array_equal(seed, [1.0, 2.0, 3.0])
    assert not np.shares_memory(y.grad.data, x.grad.data) and not np.shares_memory(x.grad.data, seed)
    y.grad.data[...] = -1
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0, 6.0])


def _shares(a, b):
    return np.shares_memory(np.asarray(a), np.asarray(b))


def _unary(fn, elements=None):
    return (1, fn, elements)


# Every op of the engine, as (arity, function of the input tensors, value strategy).
POSITIVE = floats(0.2, 2.0)
OPS = {
    "add": (2, lambda a, b: a + b, None), "sub": (2, lambda a, b: a - b, None), "mul": (2, lambda a, b: a * b, None),
    "div": (2, lambda a, b: a / b, POSITIVE), "pow": (2, lambda a, b: a ** b, POSITIVE),
    "maximum": (2, F.maximum, None), "minimum": (2, F.minimum, None),
    "where": (2, lambda a, b: F.where(a.data > 0, a, b), None),
    "neg": _unary(F.neg), "exp": _unary(F.exp), "log": _unary(F.log, POSITIVE), "sqrt": _unary(F.sqrt, POSITIVE),
    "abs": _unary(F.abs), "clip": _unary(lambda x: F.clip(x, -0.5, 0.5)), "relu": _unary(F.relu),
    "leaky_relu": _unary(F.leaky_relu), "sigmoid": _unary(F.sigmoid), "tanh": _unary(F.tanh),
    "softmax": _unary(F.softmax), "log_softmax": _unary(F.log_softmax), "squash": _unary(F.squash),
    "pow_scalar": _unary(lambda x: x ** 3), "sum": _unary(F.sum), "sum_axis": _unary(lambda x: F.sum(x, axis=-1)),
    "mean": _unary(F.mean), "max": _unary(F.max), "min": _unary(lambda x: F.min(x, axis=0)),
    "reshape": _unary(lambda x: F.reshape(x, (-1,))), "transpose": _unary(F.transpose),
    "expand_dims": _unary(lambda x: F.expand_dims(x, 0)), "getitem": _unary(lambda x: x[..., :1]),
    "fancy_getitem": _unary(lambda x: F.reshape(x, (-1,))[np.array([0, 0])]),
    "pad": _unary(lambda x: F.pad(x, [(1, 0)] * x.ndim)), "cast": _unary(lambda x: F.cast(x, np.float32)),
    "copy": _unary(F.copy), "identity": _unary(F.identity), "broadcast_to": _unary(lambda x: F.broadcast_to(x, (2,) + x.shape)),
    "concatenate": (2, lambda a, b: F.concatenate([a, b], axis=0), None),
    "stack": (2, lambda a, b: F.stack([a, b]), None),
    "same_tensor_twice": _unary(lambda x: x * x + x),
}


@pytest.mark.parametrize("name", sorted(OPS))
@given(data=st.data())
def test_backward_leaves_inputs_and_seed_unchanged_and_gradients_owned(name, data):
    arity, fn, elements = OPS[name]
    shape = data.draw(shapes(min_dims=1, max_dims=3), label="shape")
    values = [data.draw(arrays(shape, elements=elements), label=f"x{k}") for k in range(arity)]
    originals = [v.copy() for v in values]
    inputs = [tc.Tensor(v, requires_grad=True) for v in values]
    y = fn(*inputs)
    seed = data.draw(arrays(y.shape), label="seed").astype(y.dtype)
    seed_before = seed.copy()
    y.backward(tc.Tensor(seed))
    np.testing.assert_array_equal(seed, seed_before)
    for x, v, before in zip(inputs, values, originals):
        np.testing.assert_array_equal(v, before)
        assert x.data is v
    grads = [x.grad.data for x in inputs if x.grad is not None]
    for k, g in enumerate(grads):
        assert isinstance(g, np.ndarray) and g.flags.writeable
        assert not _shares(g, seed)
        assert not any(_shares(g, v) for v in values)
        assert not any(_shares(g, other) for other in grads[k + 1:])


def test_conv_and_capsule_ops_leave_inputs_unchanged_and_gradients_owned():
    rng = np.random.default_rng(0)
    cases = [
        (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), [(2, 3, 5, 5), (4, 3, 3, 3), (4,)]),
        (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2), [(2, 3, 3, 3), (3, 2, 3, 3), (2,)]),
        (F.capsule_predict, [(2, 3, 4), (3, 2, 5, 4)]),
        (F.routing_weighted_sum, [(2, 3, 4), (2, 3, 4, 5)]),
        (F.routing_agreement, [(2, 3, 4, 5), (2, 4, 5)]),
        (lambda x, w, b: F.linear(x, w, b), [(3, 4), (2, 4), (2,)]),
    ]
    for fn, input_shapes in cases:
        values = [rng.standard_normal(s) for s in input_shapes]
        originals = [v.copy() for v in values]
        inputs = [tc.Tensor(v, requires_grad=True) for v in values]
        y = fn(*inputs)
        seed = rng.standard_normal(y.shape)
        seed_before = seed.copy()
        y.backward(seed)
        np.testing.assert_array_equal(seed, seed_before)
        for v, before, x in zip(values, originals, inputs):
            np.testing.assert_array_equal(v, before)
            assert x.grad.data.flags.writeable and not _shares(x.grad.data, seed)
        for i, a in enumerate(inputs):
            for b in inputs[i + 1:]:
                assert not _shares(a.grad.data, b.grad.data)


# ----- 4. in-place updates and their detection -----
def test_in_place_methods_return_self_and_count_versions():
    x = tc.tensor(np.zeros(3))
    assert x._version == 0
    assert x.add_(np.ones(3), alpha=2) is x and x._version == 1
    assert x.mul_(3.0) is x and x._version == 2
    assert x.copy_(tc.tensor(np.arange(3.0))) is x and x._version == 3
    assert x.fill_(7.0) is x and x._version == 4
    assert x.zero_() is x and x._version == 5
    np.testing.assert_array_equal(x.numpy(), np.zeros(3))
    with pytest.raises(ValueError, match="does not broadcast"):
        x.add_(np.ones(4))


def test_in_place_on_a_leaf_that_requires_grad_needs_no_grad():
    p = tc.tensor(np.ones(3), requires_grad=True)
    for update in (lambda: p.add_(1.0), lambda: p.mul_(2.0), lambda: p.zero_(), lambda: p.fill_(1.0),
                   lambda: p.copy_(np.ones(3))):
        with pytest.raises(tc.GraphError, match="no_grad"):
            update()
    with tc.no_grad():
        p.add_(1.0)
    assert p._version == 1 and p.creator is None
    with pytest.raises(tc.GraphError, match="part of a graph"):
        (p * 2.0).add_(1.0)


def test_backward_after_an_optimizer_step_raises_naming_the_op():
    w = tc.tensor(np.ones(3), requires_grad=True)
    x = tc.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    loss = F.sum(w * x)
    opt = tc.optim.SGD([w, x], lr=0.1)
    loss.backward(retain_graph=True)
    opt.step()
    with pytest.raises(tc.GraphError, match=r"Mul: an input of shape \(3,\) was modified in place after the "
                                            r"forward \(version 0 -> 1\)"):
        loss.backward()


def test_a_view_shares_its_base_version_so_a_saved_transpose_sees_the_update():
    w = tc.tensor(np.ones((2, 3)), requires_grad=True)
    x = tc.tensor(np.ones((4, 3)), requires_grad=True)
    y = F.sum(F.tanh(x @ w.T) * 2.0)  # MatMul saves w.T (a view of w)
    with tc.no_grad():
        w.add_(1.0)
    with pytest.raises(tc.GraphError, match="modified in place"):
        y.backward()


def test_a_saved_output_modified_in_place_is_detected_and_load_state_dict_bumps():
    x = tc.tensor(np.ones(3), requires_grad=True)
    y = F.exp(x)  # Exp saves its output
    z = y.detach()
    z.mul_(2.0)  # detach shares the data and the version counter
    with pytest.raises(tc.GraphError, match="Exp: its output"):
        F.sum(y).backward()
    layer = tc.nn.Linear(3, 2)
    out = F.sum(layer(tc.tensor(np.ones((1, 3), np.float32), requires_grad=True)) ** 2)  # saves weight.T
    layer.load_state_dict({k: v.copy() for k, v in layer.state_dict().items()})
    with pytest.raises(tc.GraphError, match="modified in place"):
        out.backward()


# ----- 5. memory during backward -----
def test_ops_that_need_only_shapes_keep_no_arrays():
    x = tc.tensor(np.ones((2, 3)), requires_grad=True)
    a = x * 3.0
    a_array = weakref.ref(a.data)
    b = F.reshape(a + 1.0, (3, 2))
    y = F.sum(F.transpose(b))
    del a, b
    gc.collect()
    assert a_array() is None  # Add, Reshape, Transpose and Sum held only shapes
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 3.0))


def test_im2col_keeps_no_input_and_relu_keeps_a_mask():
    x = tc.tensor(np.random.default_rng(0).standard_normal((2, 3, 6, 6)), requires_grad=True)
    h = F.relu(x)
    col = F.im2col(h, 3)
    assert isinstance(col.creator, Im2Col)
    assert "_InputInfo" in type(col.creator.inputs[0]).__name__
    relu_node = h.creator
    assert relu_node.positive.dtype == bool and "_InputInfo" in type(relu_node.inputs[0]).__name__


def test_no_masks_are_built_under_no_grad(monkeypatch):
    calls = []
    monkeypatch.setattr(ReLU, "keep_for_backward", lambda self, arrays, y: calls.append(1))
    x = tc.tensor(np.ones(3), requires_grad=True)
    with tc.no_grad():
        F.relu(x)
    assert calls == []
    F.relu(x)
    assert calls == [1]


def test_nodes_and_intermediate_gradients_are_freed_during_backward():
    x = tc.tensor(np.ones(4), requires_grad=True)
    a = x * 2.0
    b = F.exp(a)
    c = F.sum(b * b)
    freed_when_a_arrives = {}
    gradient_of_b = {}
    b.register_hook(lambda g: gradient_of_b.update(ref=weakref.ref(g.data)))
    exp_node = b.creator

    def on_a(g):
        gc.collect()
        freed_when_a_arrives["b_grad"] = gradient_of_b["ref"]() is None
        freed_when_a_arrives["exp_node"] = "inputs" not in vars(exp_node) and "_saved_output" not in vars(exp_node)

    a.register_hook(on_a)
    c.backward()
    assert freed_when_a_arrives == {"b_grad": True, "exp_node": True}


def test_several_paths_accumulate_into_one_buffer():
    x = tc.tensor(np.ones((3, 4)), requires_grad=True)
    u = F.identity(x)
    y = F.sum(u * 1.0) + F.sum(u * 2.0) + F.sum(u * 3.0) + F.sum(u * 4.0)
    arrivals = []
    u.register_hook(arrivals.append)
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 4), 10.0))
    assert len(arrivals) == 1


# ----- 7. profiler -----
def test_profile_counts_calls_forward_backward_and_bytes():
    x = tc.tensor(np.ones((8, 8)), requires_grad=True)
    with tc.profile() as prof:
        y = F.sum(F.tanh(x @ x) * 2.0)
        y.backward()
    totals = prof.totals()
    assert totals["MatMul"]["calls"] == 1 and totals["Tanh"]["calls"] == 1 and totals["Sum"]["calls"] == 1
    assert totals["MatMul"]["bytes"] >= 8 * 8 * 8 * 3  # its output and two gradients
    assert totals["MatMul"]["forward_s"] > 0 and totals["MatMul"]["backward_s"] > 0
    assert set(totals["Mul"]) == {"calls", "forward_s", "backward_s", "bytes"}
    assert "Mul" in totals and totals["Mul"]["calls"] == 1  # ops run by a backward are not counted as calls
    table = prof.table(sort_by="calls", top=2)
    assert "MatMul" in table or "Tanh" in table
    assert len(table.splitlines()) == 2 + 2 + 2
    with pytest.raises(ValueError, match="sort_by"):
        prof.table(sort_by="speed")
    F.sum(x * 3.0)  # outside the profile: not recorded
    assert prof.totals()["Mul"]["calls"] == 1


def test_profile_records_only_its_own_thread():
    x = tc.tensor(np.ones(3))
    with tc.profile() as prof:
        worker = threading.Thread(target=lambda: F.exp(x))
        worker.start()
        worker.join()
        F.neg(x)
    assert set(prof.totals()) == {"Neg"}


def test_train_profile_prints_the_table_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from tinygrad_caps.models.cli import main

    monkeypatch.chdir(tmp_path)
    status = main(["train", "--dataset", "fashion-mnist", "--limit-train", "64", "--batch-size", "16",
                   "--conv1-channels", "8", "--primary-types", "4", "--digit-dim", "4", "--profile", "2",
                   "--no-progress", "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert status == 0
    assert "MatMul" in out and "backward s" in out and "2 training batches" in out
    assert "run folder" not in out and list(tmp_path.iterdir()) == []
