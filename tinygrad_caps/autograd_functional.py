"""Functional autodiff: vector-Jacobian, Jacobian-vector and Hessian-vector products, full Jacobians
and Hessians of a function of Tensors, with ``torch.autograd.functional`` semantics.

``func`` takes the input Tensors (one argument per input) and returns one Tensor. The caller's
tensors are never modified: each call differentiates fresh leaves sharing their data, except with
``create_graph=True``, where an input that requires grad enters through an identity node, so the
results stay differentiable with respect to it. There is no forward mode: ``jvp`` is the vjp of a
vjp (the vjp ``u -> J^T u`` is linear in ``u``, so its own vjp with ``v`` is ``J v``), which works
because every backward of the engine is built from differentiable ops.
"""
from __future__ import annotations

from . import autograd
from .factories import zeros_like
from .ops.identity import identity
from .ops.shape import reshape, stack
from .tensor import Tensor

__all__ = ["hessian", "hvp", "jacobian", "jvp", "vjp"]


def _prepare_inputs(name, inputs, create_graph):
    """(is_tuple, differentiable stand-ins for the inputs)."""
    is_tuple = isinstance(inputs, (tuple, list))
    items = tuple(inputs) if is_tuple else (inputs,)
    if is_tuple and not items:
        raise ValueError(f"{name}: inputs is an empty tuple")
    prepared = []
    for k, x in enumerate(items):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: inputs must be Tensors, input {k} is {type(x).__name__}")
        if x.dtype.kind not in "fc":
            raise TypeError(f"{name}: input {k} has dtype {x.dtype}; only floating tensors can be differentiated")
        if create_graph and x.requires_grad:
            prepared.append(identity(x))
        else:
            prepared.append(Tensor._wrap(x.data).requires_grad_())
    return is_tuple, tuple(prepared)


def _call(name, func, xs):
    y = func(*xs)
    if not isinstance(y, Tensor):
        raise TypeError(f"{name}: func must return one Tensor, got {type(y).__name__}")
    return y


def _vector(name, v, like, what):
    """``v`` as a Tensor of ``like``'s shape, dtype and device; ones when None and ``like`` has one element."""
    if v is None:
        if like.size != 1:
            raise ValueError(f"{name}: v may be omitted only when the {what} has one element; it has shape {like.shape}")
        return Tensor._wrap(like.xp.ones(like.shape, dtype=like.dtype))
    if not isinstance(v, Tensor):
        v = Tensor(v, dtype=like.dtype, device=like.device)
    if v.shape != like.shape:
        raise ValueError(f"{name}: v has shape {v.shape} but the {what} has shape {like.shape}")
    return v if v.dtype == like.dtype else v.astype(like.dtype)


def _input_vectors(name, v, xs, is_tuple):
    if not is_tuple:
        return (_vector(name, v, xs[0], "input"),)
    if v is None:
        return tuple(_vector(name, None, x, f"input {k}") for k, x in enumerate(xs))
    if not isinstance(v, (tuple, list)) or len(v) != len(xs):
        shapes = ", ".join(str(x.shape) for x in xs)
        raise ValueError(f"{name}: v must be a tuple of {len(xs)} tensors matching the inputs' shapes ({shapes})")
    return tuple(_vector(name, vk, x, f"input {k}") for k, (vk, x) in enumerate(zip(v, xs)))


def _grads(outputs, seeds, xs, create_graph, retain_graph=None):
    """sum_k J_k^T seed_k for each x in ``xs``: zeros where no output depends on x."""
    pairs = [(y, s) for y, s in zip(outputs, seeds) if y.requires_grad]
    result = [None] * len(xs)
    if pairs:
        result = autograd.grad([y for y, _ in pairs], list(xs), [s for _, s in pairs], retain_graph=retain_graph,
                               create_graph=create_graph, allow_unused=True)
    return tuple(zeros_like(x) if g is None else g for g, x in zip(result, xs))


def _finish(value, create_graph):
    return value if create_graph else value.detach()


def _pack(values, is_tuple):
    return tuple(values) if is_tuple else values[0]


def vjp(func, inputs, v=None, create_graph=False):
    """The vector-Jacobian product ``v^T J`` of ``func`` at ``inputs``.

    Args:
        func: function of the input Tensors returning one Tensor y.
        inputs: a Tensor or a tuple of Tensors.
        v: the output-space vector, y's shape; may be None when y has one element.
        create_graph: keep the results differentiable (with respect to the inputs and ``v``).
    Returns:
        (y, vjp): vjp has the shape of ``inputs`` (a tuple of gradients for a tuple of inputs).
    """
    with autograd.enable_grad():
        is_tuple, xs = _prepare_inputs("vjp", inputs, create_graph)
        y = _call("vjp", func, xs)
        seed = _vector("vjp", v, y, "output")
        grads = _grads([y], [seed], xs, create_graph)
    return _finish(y, create_graph), _pack([_finish(g, create_graph) for g in grads], is_tuple)


def jvp(func, inputs, v=None, create_graph=False):
    """The Jacobian-vector product ``J v`` of ``func`` at ``inputs``, by the double-vjp trick.

    Args:
        func: function of the input Tensors returning one Tensor y.
        inputs: a Tensor or a tuple of Tensors.
        v: the input-space vector (a tuple for a tuple of inputs), the inputs' shapes; may be None
            when each input has one element.
        create_graph: keep the results differentiable.
    Returns:
        (y, jvp): jvp has y's shape.
    """
    with autograd.enable_grad():
        is_tuple, xs = _prepare_inputs("jvp", inputs, create_graph)
        y = _call("jvp", func, xs)
        vs = _input_vectors("jvp", v, xs, is_tuple)
        result = zeros_like(y)
        if y.requires_grad:
            u = zeros_like(y, requires_grad=True)
            transposed = _grads([y], [u], xs, create_graph=True)  # J^T u, linear in u
            (result,) = _grads(list(transposed), list(vs), (u,), create_graph)
    return _finish(y, create_graph), _finish(result, create_graph)


def _scalar_output(name, y):
    if y.size != 1:
        raise ValueError(f"{name}: func must return a one-element tensor, got shape {y.shape}")


def hvp(func, inputs, v, create_graph=False):
    """The Hessian-vector product ``H v`` of a scalar ``func`` at ``inputs`` (the vjp of its gradient).

    Args:
        func: function of the input Tensors returning a one-element Tensor y.
        inputs: a Tensor or a tuple of Tensors.
        v: the input-space vector (a tuple for a tuple of inputs), the inputs' shapes.
        create_graph: keep the results differentiable.
    Returns:
        (y, hvp): hvp has the shape of ``inputs`` (a tuple for a tuple of inputs).
    """
    with autograd.enable_grad():
        is_tuple, xs = _prepare_inputs("hvp", inputs, create_graph)
        y = _call("hvp", func, xs)
        _scalar_output("hvp", y)
        vs = _input_vectors("hvp", v, xs, is_tuple)
        gradient = _grads([y], [_vector("hvp", None, y, "output")], xs, create_graph=True)
        products = _grads(list(gradient), list(vs), xs, create_graph)
    return _finish(y, create_graph), _pack([_finish(p, create_graph) for p in products], is_tuple)


def _jacobian_blocks(y, xs, create_graph):
    """[d y / d x for x in xs], each of shape y.shape + x.shape: one vjp per element of y."""
    rows = [[] for _ in xs]
    xp = y.xp
    for k in range(y.size):
        basis = xp.zeros(y.size, dtype=y.dtype)
        basis[k] = 1
        grads = _grads([y], [Tensor._wrap(basis.reshape(y.shape))], xs, create_graph, retain_graph=True)
        for row, g in zip(rows, grads):
            row.append(g)
    blocks = []
    for x, row in zip(xs, rows):
        shape = y.shape + x.shape
        if not row:
            blocks.append(Tensor._wrap(xp.zeros(shape, dtype=x.dtype)))
        elif create_graph:
            blocks.append(reshape(stack(row), shape))
        else:
            blocks.append(Tensor._wrap(xp.stack([g.data for g in row]).reshape(shape)))
    return blocks


def jacobian(func, inputs, create_graph=False):
    """The full Jacobian of ``func`` at ``inputs``, one vjp per output element.

    Args:
        func: function of the input Tensors returning one Tensor y.
        inputs: a Tensor or a tuple of Tensors.
        create_graph: keep the results differentiable.
    Returns:
        For one input, a Tensor of shape ``y.shape + input.shape``; for a tuple of inputs, a tuple
        of those, one per input.
    """
    with autograd.enable_grad():
        is_tuple, xs = _prepare_inputs("jacobian", inputs, create_graph)
        y = _call("jacobian", func, xs)
        blocks = _jacobian_blocks(y, xs, create_graph)
    return _pack([_finish(b, create_graph) for b in blocks], is_tuple)


def hessian(func, inputs, create_graph=False):
    """The Hessian of a scalar ``func`` at ``inputs`` (the Jacobian of its gradient).

    Args:
        func: function of the input Tensors returning a one-element Tensor.
        inputs: a Tensor or a tuple of Tensors.
        create_graph: keep the results differentiable.
    Returns:
        For one input, a Tensor of shape ``input.shape + input.shape``; for a tuple of inputs, a
        tuple of tuples: entry [i][j] of shape ``inputs[i].shape + inputs[j].shape``.
    """
    with autograd.enable_grad():
        is_tuple, xs = _prepare_inputs("hessian", inputs, create_graph)
        y = _call("hessian", func, xs)
        _scalar_output("hessian", y)
        gradient = _grads([y], [_vector("hessian", None, y, "output")], xs, create_graph=True)
        rows = [tuple(_finish(b, create_graph) for b in _jacobian_blocks(g, xs, create_graph)) for g in gradient]
    return tuple(rows) if is_tuple else rows[0][0]
