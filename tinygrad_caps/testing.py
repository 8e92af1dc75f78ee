"""Property-test kit for your own ops: Hypothesis strategies for Tensors and ``check_op``.

    from hypothesis import strategies as st
    from tinygrad_caps.testing import broadcastable_shapes, check_op, tensors

    def test_my_op():
        check_op(my_op, tensors(shape=(3, 4)), tensors(shape=(4,)))

``check_op`` draws inputs with Hypothesis (under the active settings profile) and checks the
op's backward, and by default its double backward, against float64 central differences on
contiguous and non-contiguous inputs, and that neither the forward nor the backward writes
into the inputs or into the upstream gradient. Needs ``hypothesis``
(``pip install 'tinygrad-caps[testing]'``; the ``dev`` extra has it too).
"""
from __future__ import annotations

import numpy as np
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from . import autograd
from .gradcheck import GradcheckError, _as_float64_input, check_double_grad, check_grad
from .tensor import Tensor

__all__ = ["broadcastable_shapes", "check_gradients", "check_op", "tensors"]


def _default_elements(dtype):
    width = 32 if np.dtype(dtype) == np.float32 else 64
    return st.floats(-2.0, 2.0, allow_nan=False, allow_infinity=False, allow_subnormal=False, width=width)


def _layout(draw, shape, contiguous):
    """'contiguous', 'transposed' (the reversed shape drawn, then .T) or 'strided' (every other element)."""
    if contiguous is True or not shape:
        return "contiguous"
    choices = ["strided"] + (["transposed"] if len(shape) >= 2 else [])
    if contiguous is None:
        choices.append("contiguous")
    return draw(st.sampled_from(choices))


@st.composite
def tensors(draw, shape=(2, 3), dtype=np.float64, contiguous=None, elements=None):
    """A strategy for Tensors (no grad) of a fixed ``shape`` (a tuple, or a strategy drawing one).

    Args:
        shape: the tensor's shape, or a Hypothesis strategy of shapes.
        dtype: a floating dtype (float64 by default; check_op differentiates in float64 anyway).
        contiguous: True for C-contiguous data; False for a strided or transposed view (non-contiguous
            whenever the shape has more than one element); None to draw either.
        elements: a strategy for the values (default: finite floats in [-2, 2]).
    Returns:
        Tensors whose ``.data`` may be a view of a larger array, as views reach real ops.
    """
    if isinstance(shape, st.SearchStrategy):
        shape = draw(shape)
    shape = tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise ValueError(f"tensors: dtype must be floating, got {dtype}")
    elements = elements if elements is not None else _default_elements(dtype)
    layout = _layout(draw, shape, contiguous)
    if layout == "transposed":
        array = draw(hnp.arrays(dtype, tuple(reversed(shape)), elements=elements)).T
    elif layout == "strided":
        base = draw(hnp.arrays(dtype, shape[:-1] + (2 * shape[-1],), elements=elements))
        array = base[..., ::2]
    else:
        array = draw(hnp.arrays(dtype, shape, elements=elements))
    return Tensor._wrap(array)


def broadcastable_shapes(n, min_dims=0, max_dims=3, min_side=1, max_side=3):
    """A strategy for tuples of ``n`` shapes that broadcast together (e.g. ((3, 1), (2, 1, 4)))."""
    return hnp.mutually_broadcastable_shapes(num_shapes=n, min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                                             max_side=max_side).map(lambda shapes: tuple(shapes.input_shapes))


def _flatten(drawn):
    inputs = []
    for item in drawn:
        inputs.extend(item if isinstance(item, (tuple, list)) else [item])
    return inputs


def _check_nothing_written(fn, arrays, double):
    """Run forward, backward (and double backward) once; raise if an input or upstream gradient changed."""
    copies = [a.copy() for a in arrays]
    xs = [Tensor._wrap(a).requires_grad_() for a in arrays]
    with autograd.enable_grad():
        y = fn(*xs)
        if not isinstance(y, Tensor):
            raise TypeError(f"check_op: the op must return a Tensor, got {type(y).__name__}")
        upstream = y.xp.asarray(np.random.default_rng(0).standard_normal(y.shape))
        upstream_copy = upstream.copy()
        if y.requires_grad:
            grads = autograd.grad([y], xs, [Tensor._wrap(upstream)], create_graph=double, allow_unused=True)
            if double:
                differentiable = [g for g in grads if g is not None and g.requires_grad]
                if differentiable:
                    seeds = [Tensor._wrap(g.xp.ones(g.shape, dtype=g.dtype)) for g in differentiable]
                    autograd.grad(differentiable, xs, seeds, allow_unused=True)
    for k, (a, before) in enumerate(zip(arrays, copies)):
        if not np.array_equal(a, before):
            raise GradcheckError(f"check_op: the op wrote into input {k} (shape {a.shape})")
    if not np.array_equal(upstream, upstream_copy):
        raise GradcheckError(f"check_op: the backward wrote into the upstream gradient (shape {upstream.shape})")


def check_gradients(fn, inputs, double=True, **tolerances):
    """One example of ``check_op``: ``fn``'s backward (and double backward) at ``inputs`` (arrays or
    Tensors, taken in float64, views kept) against central differences, and nothing written into
    the inputs or the upstream gradient. ``tolerances``: atol, rtol, eps, max_elementwise (see
    ``tinygrad_caps.gradcheck.check_grad``). Returns True; raises GradcheckError."""
    arrays = [_as_float64_input(x) for x in inputs]
    _check_nothing_written(fn, arrays, double)
    check_grad(fn, arrays, **tolerances)
    if double:
        check_double_grad(fn, arrays, **tolerances)
    return True


def check_op(fn, *input_strategies, double=True, atol=1e-5, rtol=1e-4):
    """Property-check ``fn``'s gradients on inputs drawn from ``input_strategies``.

    Args:
        fn: the op, a function of Tensors returning one Tensor.
        input_strategies: one strategy per argument of ``fn`` (e.g. ``tensors(...)``); a strategy
            that draws a tuple supplies several arguments at once.
        double: also check the double backward (gradients of the gradients).
        atol, rtol: tolerances of the comparison with central differences (in float64).
    Returns:
        None; raises ``GradcheckError`` (an AssertionError, shown with Hypothesis's minimal
        failing inputs) when a derivative disagrees or the op writes into its inputs or upstream gradient.
    """
    if not input_strategies:
        raise ValueError("check_op: give at least one input strategy")

    @given(st.tuples(*input_strategies))
    def property_of_fn(drawn):
        check_gradients(fn, _flatten(drawn), double, atol=atol, rtol=rtol)

    property_of_fn()
