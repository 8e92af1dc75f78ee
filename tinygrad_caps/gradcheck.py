"""Finite-difference checks of the engine's gradients, for our tests and for researchers' own ops.

Both checks work in float64 with central differences on a scalar projection ``L = sum(f(x) * g)``
for a fixed random ``g``. Small inputs are checked element by element; larger ones along random
directions (as Chainer's ``check_backward`` does), which costs two evaluations per direction.
"""
from __future__ import annotations

import numpy as np

from . import autograd
from .backend import to_numpy
from .tensor import Tensor


class GradcheckError(AssertionError):
    """The analytic and numeric derivatives disagree; the message names the input and the worst element."""


def _as_float64_input(x):
    data = x.data if isinstance(x, Tensor) else x
    if not hasattr(data, "dtype"):
        data = np.asarray(data, dtype=np.float64)
    if data.dtype != np.float64:
        data = data.astype(np.float64)
    return data


def _projection(f, arrays, weight):
    with autograd.no_grad():
        y = f(*[Tensor._wrap(a) for a in arrays])
    return float(to_numpy((y.data * weight).sum()))


def check_grad(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, max_elementwise=128, directions=6, seed=0):
    """Compare the engine's gradient of ``f`` with central differences, in float64.

    Args:
        f: function of Tensors returning one Tensor (any shape).
        inputs: arrays or Tensors (converted to float64; views such as transposes are kept as views).
        eps: finite-difference step. atol, rtol: pass when |analytic - numeric| <= atol + rtol*|numeric|.
        max_elementwise: inputs with at most this many elements are checked element by element;
            larger ones along ``directions`` random unit directions.
    Returns:
        True; raises GradcheckError naming the input, the worst element and both values on failure.
    """
    rng = np.random.default_rng(seed)
    arrays = [_as_float64_input(x) for x in inputs]
    xs = [Tensor._wrap(a).requires_grad_() for a in arrays]
    y = f(*xs)
    if not isinstance(y, Tensor):
        raise TypeError(f"check_grad: f must return a Tensor, got {type(y).__name__}")
    xp = y.xp
    weight = xp.asarray(rng.standard_normal(y.shape))
    if y.requires_grad:
        analytic = autograd.grad([y], xs, [Tensor._wrap(weight)], allow_unused=True)
    else:
        analytic = [None] * len(xs)
    for i, (a, g) in enumerate(zip(arrays, analytic)):
        g = np.zeros(a.shape) if g is None else to_numpy(g.data)

        def shifted(delta, i=i, a=a):
            moved = list(arrays)
            moved[i] = a + delta
            return _projection(f, moved, weight)

        if a.size <= max_elementwise:
            numeric = np.zeros(a.shape)
            for k in range(a.size):
                delta = np.zeros(a.shape)
                delta.flat[k] = eps
                delta = xp.asarray(delta)
                numeric.flat[k] = (shifted(delta) - shifted(-delta)) / (2 * eps)
            _compare(f"input {i} (shape {a.shape})", g, numeric, atol, rtol, elementwise=True)
        else:
            for d in range(directions):
                u = rng.standard_normal(a.shape)
                u /= np.linalg.norm(u)
                numeric = (shifted(xp.asarray(u * eps)) - shifted(xp.asarray(-u * eps))) / (2 * eps)
                _compare(f"input {i} (shape {a.shape}), random direction {d}", np.array([(g * u).sum()]),
                         np.array([numeric]), atol, rtol, elementwise=False)
    return True


def _compare(what, analytic, numeric, atol, rtol, elementwise):
    error = np.abs(analytic - numeric) - (atol + rtol * np.abs(numeric))
    if error.size and (error.max() > 0 or not np.all(np.isfinite(analytic))):
        worst = np.unravel_index(np.nanargmax(np.where(np.isfinite(error), error, np.inf)), error.shape)
        where = f"element {tuple(int(i) for i in worst)}" if elementwise else "directional derivative"
        raise GradcheckError(
            f"gradient mismatch for {what} at {where}: analytic {analytic[worst]:.10g} vs numeric "
            f"{numeric[worst]:.10g} (|diff| {abs(analytic[worst] - numeric[worst]):.3g}, atol {atol}, rtol {rtol})"
        )


def check_double_grad(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, max_elementwise=128, directions=6, seed=0):
    """Check second derivatives: the gradient of ``sum_i <df/dx_i, r_i>`` (built with create_graph=True)
    against central differences of that first-order quantity. Arguments as in ``check_grad``.

    A backward that is not made of differentiable ops fails here, since its gradient carries no graph.
    """
    rng = np.random.default_rng(seed + 1)
    arrays = [_as_float64_input(x) for x in inputs]
    probe = f(*[Tensor._wrap(a) for a in arrays])
    xp = probe.xp
    weight = Tensor._wrap(xp.asarray(rng.standard_normal(probe.shape)))
    directions_r = [xp.asarray(rng.standard_normal(a.shape)) for a in arrays]

    def first_order(*xs):
        with autograd.enable_grad():
            xs = [x if x.requires_grad else Tensor._wrap(x.data).requires_grad_() for x in xs]
            y = f(*xs)
            grads = autograd.grad([y], xs, [weight], create_graph=True, allow_unused=True) if y.requires_grad else ()
        total = None
        for g, r in zip(grads, directions_r):
            if g is not None:
                term = (g * Tensor._wrap(r)).sum()
                total = term if total is None else total + term
        return total if total is not None else Tensor._wrap(xp.zeros(()))

    return check_grad(first_order, arrays, eps, atol, rtol, max_elementwise, directions, seed + 2)
