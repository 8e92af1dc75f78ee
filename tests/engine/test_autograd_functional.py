"""tc.vjp / jvp / hvp / jacobian / hessian: against float64 central differences, against
torch.autograd.functional where PyTorch is installed, and their contracts (shapes, errors, the
caller's tensors left alone, create_graph)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps.testing import tensors

STEP = 1e-6


def vector_func(x, w):
    """(3,) from x (2, 3) and w (3,): smooth and genuinely coupled in both inputs."""
    return F.sum(F.tanh(x * w) * x, axis=0) + F.exp(w) * 0.5


def scalar_func(x, w):
    return F.sum(F.tanh(x * w) ** 2) + F.sum(F.exp(w) * F.sum(x, axis=0))


def evaluate(func, arrays):
    with tc.no_grad():
        return func(*[tc.Tensor(a) for a in arrays]).numpy()


def numeric_jacobians(func, arrays, step=STEP):
    """[d func / d arrays[i]] of shape out.shape + arrays[i].shape, by central differences."""
    out_shape = evaluate(func, arrays).shape
    blocks = []
    for i, a in enumerate(arrays):
        block = np.zeros(out_shape + a.shape)
        for k in range(a.size):
            delta = np.zeros(a.shape)
            delta.flat[k] = step
            plus = [b + delta if j == i else b for j, b in enumerate(arrays)]
            minus = [b - delta if j == i else b for j, b in enumerate(arrays)]
            block.reshape(out_shape + (-1,))[..., k] = (evaluate(func, plus) - evaluate(func, minus)) / (2 * step)
        blocks.append(block)
    return blocks


def numeric_hessian(func, arrays, i, j, step=1e-4):
    """d^2 func / d arrays[i] d arrays[j] by central differences of the central-difference gradient."""
    def gradient_i(*shifted):
        return numeric_jacobians(func, list(shifted), step)[i]

    a = arrays[j]
    block = np.zeros(arrays[i].shape + a.shape)
    for k in range(a.size):
        delta = np.zeros(a.shape)
        delta.flat[k] = step
        plus = [b + delta if m == j else b for m, b in enumerate(arrays)]
        minus = [b - delta if m == j else b for m, b in enumerate(arrays)]
        block.reshape(arrays[i].shape + (-1,))[..., k] = (gradient_i(*plus) - gradient_i(*minus)) / (2 * step)
    return block


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((2, 3)), rng.standard_normal(3) * 0.7]


def as_tensors(arrays):
    return tuple(tc.Tensor(a) for a in arrays)


@given(x=tensors(shape=(2, 3), dtype=np.float64), w=tensors(shape=(3,), dtype=np.float64))
def test_jacobian_matches_central_differences(x, w):
    arrays = [x.numpy(), w.numpy()]
    expected = numeric_jacobians(vector_func, arrays)
    result = tc.jacobian(vector_func, (x, w))
    assert isinstance(result, tuple) and len(result) == 2
    for got, want in zip(result, expected):
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, atol=1e-7)
    single = tc.jacobian(lambda a: vector_func(a, w), x)
    assert isinstance(single, tc.Tensor) and single.shape == (3, 2, 3)
    np.testing.assert_allclose(single.numpy(), expected[0], atol=1e-7)


@given(x=tensors(shape=(2, 3), dtype=np.float64), w=tensors(shape=(3,), dtype=np.float64), data=st.data())
def test_vjp_and_jvp_match_central_differences(x, w, data):
    arrays = [x.numpy(), w.numpy()]
    jx, jw = numeric_jacobians(vector_func, arrays)
    u = data.draw(tensors(shape=(3,), dtype=np.float64))
    vx, vw = data.draw(tensors(shape=(2, 3), dtype=np.float64)), data.draw(tensors(shape=(3,), dtype=np.float64))
    y, (gx, gw) = tc.vjp(vector_func, (x, w), u)
    np.testing.assert_allclose(y.numpy(), evaluate(vector_func, arrays), rtol=1e-12)
    np.testing.assert_allclose(gx.numpy(), np.einsum("o,oij->ij", u.numpy(), jx), atol=1e-7)
    np.testing.assert_allclose(gw.numpy(), u.numpy() @ jw, atol=1e-7)
    y, jv = tc.jvp(vector_func, (x, w), (vx, vw))
    assert jv.shape == (3,)
    np.testing.assert_allclose(jv.numpy(), np.einsum("oij,ij->o", jx, vx.numpy()) + jw @ vw.numpy(), atol=1e-7)


def test_hvp_and_hessian_match_central_differences():
    arrays = inputs(1)
    x, w = as_tensors(arrays)
    h = tc.hessian(scalar_func, (x, w))
    assert [[block.shape for block in row] for row in h] == [[(2, 3, 2, 3), (2, 3, 3)], [(3, 2, 3), (3, 3)]]
    for i in range(2):
        for j in range(2):
            np.testing.assert_allclose(h[i][j].numpy(), numeric_hessian(scalar_func, arrays, i, j), atol=1e-5)
    single = tc.hessian(lambda a: scalar_func(a, w), x)
    assert single.shape == (2, 3, 2, 3)
    np.testing.assert_allclose(single.numpy(), h[0][0].numpy(), rtol=1e-12)
    rng = np.random.default_rng(2)
    vx, vw = rng.standard_normal((2, 3)), rng.standard_normal(3)
    y, (hx, hw) = tc.hvp(scalar_func, (x, w), (tc.Tensor(vx), tc.Tensor(vw)))
    assert y.shape == () or y.size == 1
    np.testing.assert_allclose(hx.numpy(), np.einsum("ijkl,kl->ij", h[0][0].numpy(), vx) + h[0][1].numpy() @ vw, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(hw.numpy(), np.einsum("ikl,kl->i", h[1][0].numpy(), vx) + h[1][1].numpy() @ vw, rtol=1e-10, atol=1e-12)


def test_the_callers_tensors_are_left_alone():
    x, w = as_tensors(inputs())
    w.requires_grad_()
    before_x, before_w = x.numpy().copy(), w.numpy().copy()
    tc.vjp(vector_func, (x, w), tc.Tensor(np.ones(3)))
    tc.jvp(vector_func, (x, w), (tc.Tensor(np.ones((2, 3))), tc.Tensor(np.ones(3))))
    tc.hvp(scalar_func, (x, w), (tc.Tensor(np.ones((2, 3))), tc.Tensor(np.ones(3))))
    tc.jacobian(vector_func, (x, w))
    tc.hessian(scalar_func, (x, w))
    assert not x.requires_grad and x.grad is None and w.grad is None and w.is_leaf
    np.testing.assert_array_equal(x.numpy(), before_x)
    np.testing.assert_array_equal(w.numpy(), before_w)


def test_results_carry_no_graph_unless_create_graph():
    x = tc.Tensor(inputs()[0], requires_grad=True)
    y, g = tc.vjp(lambda a: F.sum(a ** 3), x)
    assert not y.requires_grad and not g.requires_grad
    y, g = tc.vjp(lambda a: F.sum(a ** 3), x, create_graph=True)
    assert y.requires_grad and g.requires_grad
    F.sum(g).backward()  # d/dx sum(3 x^2) = 6 x
    np.testing.assert_allclose(x.grad.numpy(), 6 * x.numpy(), rtol=1e-12)
    jac = tc.jacobian(lambda a: a ** 2, x, create_graph=True)
    assert jac.requires_grad and jac.shape == (2, 3, 2, 3)


def test_an_input_the_output_does_not_use_gets_zeros():
    x, w = as_tensors(inputs())
    _, (gx, gw) = tc.vjp(lambda a, b: F.sum(a * a), (x, w))
    np.testing.assert_array_equal(gw.numpy(), np.zeros(3))
    jw = tc.jacobian(lambda a, b: a * 2.0, (x, w))[1]
    assert jw.shape == (2, 3, 3) and not jw.numpy().any()
    _, jv = tc.jvp(lambda a: F.sum(a) * 0 + 1.0, x, tc.Tensor(np.ones((2, 3))))
    np.testing.assert_array_equal(jv.numpy(), 0.0)


def test_results_follow_the_dtype_of_the_inputs():
    x = tc.tensor(np.ones((2, 2), dtype=np.float32))
    _, g = tc.vjp(lambda a: F.sum(a * a), x)
    assert g.dtype == np.float32 and g.device == x.device


@pytest.mark.parametrize("call, pattern", [
    (lambda x: tc.vjp(lambda a: a * 2, x), r"vjp: v may be omitted .* shape \(2, 3\)"),
    (lambda x: tc.vjp(lambda a: a * 2, x, tc.Tensor(np.ones(3))), r"vjp: v has shape \(3,\) but the output has shape \(2, 3\)"),
    (lambda x: tc.jvp(lambda a: a * 2, x, tc.Tensor(np.ones((3, 2)))), r"jvp: v has shape \(3, 2\) but the input has shape \(2, 3\)"),
    (lambda x: tc.jvp(lambda a: a * 2, x), r"jvp: v may be omitted"),
    (lambda x: tc.jvp(lambda a, b: a * b, (x, x), tc.Tensor(np.ones((2, 3)))), r"jvp: v must be a tuple of 2"),
    (lambda x: tc.hvp(lambda a: a * 2, x, tc.Tensor(np.ones((2, 3)))), r"hvp: func must return a one-element tensor, got shape \(2, 3\)"),
    (lambda x: tc.hvp(lambda a: F.sum(a), x, tc.Tensor(np.ones(6))), r"hvp: v has shape \(6,\) but the input has shape \(2, 3\)"),
    (lambda x: tc.hessian(lambda a: a * 2, x), r"hessian: func must return a one-element tensor, got shape \(2, 3\)"),
])
def test_bad_arguments_raise_value_error_naming_the_function_and_shapes(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call(tc.Tensor(np.ones((2, 3))))


def test_func_must_return_a_tensor():
    with pytest.raises(TypeError, match="vjp: func must return one Tensor"):
        tc.vjp(lambda a: (a, a), tc.Tensor(np.ones(2)), tc.Tensor(np.ones(2)))


def test_against_torch_autograd_functional():
    torch = pytest.importorskip("torch")
    functional = torch.autograd.functional
    arrays = inputs(3)
    rng = np.random.default_rng(4)
    u, vx, vw = rng.standard_normal(3), rng.standard_normal((2, 3)), rng.standard_normal(3)

    def torch_vector(x, w):
        return (torch.tanh(x * w) * x).sum(0) + torch.exp(w) * 0.5

    def torch_scalar(x, w):
        return (torch.tanh(x * w) ** 2).sum() + (torch.exp(w) * x.sum(0)).sum()

    ours_in, theirs_in = as_tensors(arrays), tuple(torch.tensor(a) for a in arrays)
    t = torch.tensor
    pairs = [
        (tc.vjp(vector_func, ours_in, tc.Tensor(u))[1], functional.vjp(torch_vector, theirs_in, t(u))[1]),
        ((tc.jvp(vector_func, ours_in, (tc.Tensor(vx), tc.Tensor(vw)))[1],),
         (functional.jvp(torch_vector, theirs_in, (t(vx), t(vw)))[1],)),
        (tc.hvp(scalar_func, ours_in, (tc.Tensor(vx), tc.Tensor(vw)))[1],
         functional.hvp(torch_scalar, theirs_in, (t(vx), t(vw)))[1]),
        (tc.jacobian(vector_func, ours_in), functional.jacobian(torch_vector, theirs_in)),
        (sum(tc.hessian(scalar_func, ours_in), ()), sum(functional.hessian(torch_scalar, theirs_in), ())),
    ]
    for ours, theirs in pairs:
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert a.shape == tuple(b.shape)
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)
    single = tc.jacobian(lambda a: vector_func(a, ours_in[1]), ours_in[0])
    np.testing.assert_allclose(single.numpy(), functional.jacobian(lambda a: torch_vector(a, theirs_in[1]), theirs_in[0]).numpy(), rtol=1e-10)
