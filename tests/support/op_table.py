"""The op table: every public op of ``tinygrad_caps.functional`` once, with what its tests need.

The forward-value (engine/test_forward_values.py), gradient and second-order
(engine/test_grad_elementwise.py), GPU (engine/test_gpu_ops.py) and PyTorch-oracle
(engine/test_torch_oracle.py) tests are parametrised from ``OPS``, as tinygrad's
``helper_test_op`` and PyTorch's ``op_db`` are; engine/test_op_table.py fails when a public name
of ``functional`` is neither here nor in ``NOT_OPS``, or when an entry names something that is
not in ``functional``. A new op is two source files (its ``ops/<family>.py`` and
``functional.py``) and one entry below.

An entry (``OpInfo``) is one way of calling an op: several entries may call one op (``op``) with
other arguments (``clip`` with both bounds or one) or through a Tensor operator (``x ** 0.5``).
Its ``sample`` draws the arguments (a ``Sample``: the differentiable float64 arrays, and keyword
arguments for the rest) for the forward check; ``grad_sample`` draws them off the op's kinks for
the gradient, second-order, GPU and PyTorch checks (default: ``sample``). ``cases`` are fixed
examples (shapes that reach a kernel path, the cases the GPU and PyTorch tests have always run),
each a function of a NumPy generator. Every check an entry is left out of is named in
``not_tested`` with the reason.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from helpers import arrays, away_from_zero, floats, on_grid, shapes
from naive_conv import naive_col2im, naive_conv2d, naive_conv_transpose2d, naive_im2col
from reference_routing import route
from tinygrad_caps.ops._common import SHORT_AXIS

# The checks an entry can be left out of (the keys of ``OpInfo.not_tested``).
CHECKS = ("forward", "grad", "second_order", "gpu", "torch")
TOL = dict(rtol=1e-12, atol=1e-13)  # float64 forward against NumPy
FLOAT32_TOL = dict(rtol=1e-6, atol=1e-7)  # any float32 result against NumPy
DEVICE_TOL = dict(rtol=1e-10, atol=1e-12)  # CuPy against NumPy, and PyTorch against us (float64)


@dataclasses.dataclass(frozen=True, eq=False)
class Sample:
    """One call's arguments: ``args`` are the differentiable inputs (float64 arrays, or lists of
    them for concatenate and stack); ``kwargs`` everything else (axes, shapes, flags, and constant
    arrays such as labels, masks and running statistics)."""

    args: tuple
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def arrays(self) -> list:
        """The differentiable inputs, flattened."""
        flat = []
        for a in self.args:
            flat.extend(a if isinstance(a, (list, tuple)) else [a])
        return flat

    def unflatten(self, flat) -> tuple:
        """``args`` with its arrays replaced, in order, by ``flat`` (Tensors, say)."""
        flat, out = list(flat), []
        for a in self.args:
            if isinstance(a, (list, tuple)):
                out.append([flat.pop(0) for _ in a])
            else:
                out.append(flat.pop(0))
        return tuple(out)

    def __repr__(self):  # what Hypothesis prints for a failing example
        args = ", ".join(f"list of {len(a)}" if isinstance(a, (list, tuple)) else f"array{np.shape(a)}" for a in self.args)
        return f"Sample(({args}), {dict(self.kwargs)!r})\n  args={self.args!r}"

    def _repr_pretty_(self, printer, cycle):
        printer.text(repr(self))


@dataclasses.dataclass(frozen=True, eq=False)
class OpInfo:
    """One entry of the table (see the module docstring).

    name: the test id.  fn: ``fn(*sample.args, **sample.kwargs)`` -> Tensor.
    sample: a strategy of Samples, the forward check's domain.
    ref: NumPy's answer, ``ref(*sample.args, **sample.kwargs)`` on the arrays.
    torch: PyTorch's name for it (an attribute path under ``torch``), or None.
    torch_call: ``torch_call(torch, *args, **kwargs)`` where the plain call of ``torch`` (with
        ``axis`` -> ``dim``, ``keepdims`` -> ``keepdim``) does not fit.
    torch_agrees: ``torch_agrees(sample)`` is False where PyTorch keeps a convention of its own
        (the PyTorch check draws another sample).
    grad_sample: the domain of the gradient, second-order, GPU and PyTorch checks, off the op's
        kinks and poles (default: ``sample``).
    kernel: a RawKernel of ``tinygrad_caps.kernels`` serves it on the GPU.
    op: the ``functional`` name it calls (default: ``name``).
    tol: the float64 forward's tolerance against ``ref`` (float32 results: FLOAT32_TOL).
    oracle_tol: CuPy's and PyTorch's values and derivatives against ours.
    grad_tol: ``check_grad``'s options (atol, rtol, max_elementwise, directions).
    square_for_second_order: the second-order checks differentiate ``fn(...) ** 2``: for ops
        (bi)linear in their inputs, whose own second derivative says little.
    cases: fixed examples, name -> ``case(rng) -> Sample``.
    not_tested: check (one of CHECKS) -> why that check does not apply.
    """

    name: str
    fn: Callable
    sample: st.SearchStrategy
    ref: Optional[Callable] = None
    torch: Optional[str] = None
    torch_call: Optional[Callable] = None
    torch_agrees: Optional[Callable] = None
    grad_sample: Optional[st.SearchStrategy] = None
    kernel: bool = False
    op: Optional[str] = None
    tol: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(TOL))
    oracle_tol: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEVICE_TOL))
    grad_tol: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    square_for_second_order: bool = False
    cases: Mapping[str, Callable] = dataclasses.field(default_factory=dict)
    not_tested: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def function(self) -> str:
        """The name in ``tinygrad_caps.functional`` this entry calls."""
        return self.op or self.name

    def tested(self, check: str) -> bool:
        """Whether ``check`` (one of CHECKS) applies; a second order needs a first."""
        if check == "second_order" and "grad" in self.not_tested:
            return False
        if check == "torch" and self.torch is None:
            return False
        return check not in self.not_tested

    @property
    def checked_sample(self) -> st.SearchStrategy:
        """The domain of the gradient, GPU and PyTorch checks."""
        return self.grad_sample if self.grad_sample is not None else self.sample

    def call_torch(self, torch, *args, **kwargs):
        if self.torch_call is not None:
            return self.torch_call(torch, *args, **kwargs)
        fn = torch
        for part in self.torch.split("."):
            fn = getattr(fn, part)
        renamed = {{"axis": "dim", "keepdims": "keepdim"}.get(k, k): v for k, v in kwargs.items()}
        return fn(*args, **renamed)

    def __repr__(self):
        return f"OpInfo({self.name})"

    def _repr_pretty_(self, printer, cycle):  # Hypothesis's report of a failing example
        printer.text(repr(self))


def bound(op: OpInfo, sample: Sample, constant=lambda value: value, square=False):
    """``f(*inputs)``: ``op.fn`` on ``sample`` with its arrays replaced by ``inputs`` (Tensors),
    its constant arrays passed through ``constant`` (to put them on a device), and squared if asked."""
    kwargs = {k: constant(v) if isinstance(v, np.ndarray) else v for k, v in sample.kwargs.items()}

    def f(*inputs):
        y = op.fn(*sample.unflatten(inputs), **kwargs)
        return y * y if square else y

    return f


def reference(op: OpInfo, sample: Sample):
    return np.asarray(op.ref(*sample.args, **sample.kwargs))


def case_params(ops, check):
    """(op, case name) pairs of the entries to which ``check`` applies, for pytest.mark.parametrize."""
    return [(op, case) for op in ops if op.tested(check) for case in op.cases]


# ----- drawing samples -----

def one(x, **kwargs):
    return Sample((x,), kwargs)


def unary(elements=None, min_side=1, **kwargs):
    """One array of any shape up to 3 dimensions (sides min_side..3)."""
    return shapes(min_side=min_side).flatmap(lambda s: arrays(s, elements)).map(lambda x: one(x, **kwargs))


def binary(left=None, right=None, min_side=1):
    """Two arrays whose shapes broadcast together."""
    return hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, min_side=min_side, max_side=3).flatmap(
        lambda s: st.tuples(arrays(s.input_shapes[0], left), arrays(s.input_shapes[1], right))).map(Sample)


@st.composite
def where_sample(draw):
    shape_c, shape_a, shape_b = draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3)).input_shapes
    return Sample((draw(arrays(shape_a)), draw(arrays(shape_b))), dict(condition=draw(hnp.arrays(bool, shape_c))))


@st.composite
def reduction_forward(draw):
    """A shape and an axis argument; sometimes large with a short last axis (the BLAS/running-extreme
    path of ``ops._common``, which switches at 4096 elements)."""
    if draw(st.booleans()):
        last = draw(st.integers(2, SHORT_AXIS))
        shape = (draw(st.integers(1, 3)), math.ceil(4096 / last) + draw(st.integers(0, 5)), last)
        x = np.random.default_rng(draw(st.integers(0, 2 ** 16))).standard_normal(shape)
        axis = draw(st.sampled_from([-1, 2, None, 0, (1, 2)]))
    else:
        x = draw(arrays(draw(shapes(min_dims=1)), unique=True))
        axis = draw(st.one_of(st.none(), st.integers(-x.ndim, x.ndim - 1)))
    return one(x, axis=axis, keepdims=draw(st.booleans()))


@st.composite
def axes_for(draw, ndim):
    """None, one axis (possibly negative) or a tuple of distinct axes."""
    if ndim == 0:
        return None
    kind = draw(st.sampled_from(["none", "one", "tuple"]))
    if kind == "none":
        return None
    if kind == "one":
        return draw(st.integers(-ndim, ndim - 1))
    return tuple(draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True)))


@st.composite
def reduction_grad(draw, elements=None, unique=False):
    x = draw(arrays(draw(shapes(min_side=1)), elements, unique=unique))
    return one(x, axis=draw(axes_for(x.ndim)), keepdims=draw(st.booleans()))


@st.composite
def along_an_axis(draw, elements=None):
    """softmax, log_softmax, squash: one array (1 to 3 dimensions) and an axis."""
    x = draw(arrays(draw(shapes(min_dims=1)), elements))
    return one(x, axis=draw(st.integers(-x.ndim, x.ndim - 1)))


@st.composite
def reshape_sample(draw):
    x = draw(arrays(draw(shapes(min_side=1, max_dims=4))))
    return one(x, shape=(-1,) + x.shape[2:] if x.ndim >= 2 else (x.size,))


@st.composite
def flatten_sample(draw):
    x = draw(arrays(draw(shapes(min_dims=1, max_dims=4))))
    return one(x, start_axis=draw(st.integers(0, x.ndim - 1)))


@st.composite
def permutation_sample(draw, allow_none=False):
    x = draw(arrays(draw(shapes(min_dims=0 if allow_none else 1, max_dims=4))))
    axes = tuple(draw(st.permutations(range(x.ndim))))
    return one(x, axes=None if allow_none and draw(st.booleans()) else axes)


@st.composite
def swapaxes_sample(draw):
    x = draw(arrays(draw(shapes(min_dims=1))))
    return one(x, axis1=draw(st.integers(-x.ndim, x.ndim - 1)), axis2=draw(st.integers(-x.ndim, x.ndim - 1)))


@st.composite
def expand_dims_sample(draw):
    x = draw(arrays(draw(shapes())))
    return one(x, axis=draw(st.integers(-x.ndim - 1, x.ndim)))


@st.composite
def squeeze_sample(draw):
    x = draw(arrays(draw(shapes(max_side=2))))
    ones = [a for a, n in enumerate(x.shape) if n == 1]
    return one(x, axis=draw(st.sampled_from([None] + ones + [a - x.ndim for a in ones])))


@st.composite
def getitem_sample(draw):
    """Basic slicing (negative steps, None, Ellipsis), integers, integer arrays (repeats) and masks."""
    x = draw(arrays(draw(shapes(min_dims=2, max_dims=3, min_side=2, max_side=4))))
    rows = np.array(draw(st.lists(st.integers(0, x.shape[0] - 1), min_size=1, max_size=6)))
    cols = np.array(draw(st.lists(st.integers(0, x.shape[1] - 1), min_size=len(rows), max_size=len(rows))))
    index = draw(st.sampled_from([
        (slice(None, None, -1), slice(1, None)), (0,), (-1,), (Ellipsis, None, slice(1, 2)), (rows,), (rows, cols),
        (draw(hnp.arrays(bool, x.shape)),),
    ]))
    return one(x, index=index)  # always a tuple: a bare array would be taken for a constant input


@st.composite
def concatenate_sample(draw):
    shape = draw(shapes(min_dims=1))
    axis = draw(st.integers(0, len(shape) - 1))
    other = shape[:axis] + (draw(st.integers(0, 3)),) + shape[axis + 1:]
    return Sample(([draw(arrays(shape)), draw(arrays(other))],), dict(axis=draw(st.sampled_from([axis, axis - len(shape)]))))


@st.composite
def stack_sample(draw):
    shape = draw(shapes(min_dims=1))
    n = draw(st.integers(2, 3))
    return Sample(([draw(arrays(shape)) for _ in range(n)],), dict(axis=draw(st.integers(-len(shape) - 1, len(shape)))))


@st.composite
def pad_sample(draw):
    x = draw(arrays(draw(shapes(min_dims=1))))
    widths = tuple(tuple(draw(st.lists(st.integers(0, 2), min_size=2, max_size=2))) for _ in range(x.ndim))
    return one(x, pad_width=draw(st.sampled_from([widths, 1])))


@st.composite
def broadcast_to_sample(draw):
    shape = draw(shapes(min_side=1))
    target = (2,) + tuple(3 if n == 1 and draw(st.booleans()) else n for n in shape)
    return one(draw(arrays(shape)), shape=target[draw(st.integers(0, 1)):])


@st.composite
def sum_to_sample(draw):
    shape_a, shape_b = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3)).input_shapes
    return one(draw(arrays(np.broadcast_shapes(shape_a, shape_b))), shape=shape_a)


@st.composite
def matmul_shapes(draw):
    """The shapes of two matmul operands: matrices with broadcast batches, or vectors on either side or both."""
    n, k, m = (draw(st.integers(1, 3)) for _ in range(3))
    batch_a, batch_b = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=2)).input_shapes
    kind = draw(st.sampled_from(["matrix", "vector_left", "vector_right", "both_vectors"]))
    a = (k,) if kind in ("vector_left", "both_vectors") else batch_a + (n, k)
    b = (k,) if kind in ("vector_right", "both_vectors") else batch_b + (k, m)
    return a, b


@st.composite
def matmul_sample(draw):
    """Two matmul operands of ``matmul_shapes``."""
    a, b = draw(matmul_shapes())
    return Sample((draw(arrays(a)), draw(arrays(b))))


@st.composite
def linear_sample(draw):
    batch = draw(shapes(min_dims=0, max_dims=2))
    n_in, n_out = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    x, w, b = draw(arrays(batch + (n_in,))), draw(arrays((n_out, n_in))), draw(arrays((n_out,)))
    return Sample((x, w, b) if draw(st.booleans()) else (x, w))


REDUCTIONS = st.sampled_from(["mean", "sum", "none"])


@st.composite
def pair_sample(draw, left=None, right=None):
    """mse_loss, binary_cross_entropy: input and target of one shape, and a reduction."""
    shape = draw(shapes(min_dims=1))
    return Sample((draw(arrays(shape, left)), draw(arrays(shape, right))), dict(reduction=draw(REDUCTIONS)))


@st.composite
def cross_entropy_sample(draw, soft=False):
    n, c = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    if soft:
        target = np.random.default_rng(draw(st.integers(0, 2 ** 16))).dirichlet(np.ones(c), size=n)
    else:
        target = np.array(draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)))
    return one(draw(arrays((n, c))), target=target, reduction=draw(REDUCTIONS))


@st.composite
def one_hot_sample(draw):
    num_classes = draw(st.integers(1, 4))
    labels = draw(hnp.arrays(np.int64, draw(shapes()), elements=st.integers(0, num_classes - 1)))
    return Sample((), dict(labels=labels, num_classes=num_classes))


@st.composite
def batch_norm_sample(draw, training, elements=None, unique=False):
    n, c = draw(st.integers(2, 4)), draw(st.integers(1, 3))
    x = draw(arrays((n, c) + draw(shapes(max_dims=2, max_side=2)), elements, unique=unique))
    args = (x, draw(arrays((c,))), draw(arrays((c,)))) if draw(st.booleans()) else (x,)
    kwargs = dict(training=training)
    if not training:
        kwargs.update(running_mean=draw(arrays((c,))), running_var=draw(arrays((c,), floats(0.5, 2.0))))
    return Sample(args, kwargs)


def _conv_geometry(draw):
    """Batch (both sides of the column-order switch at 8), channels, kernel, stride, padding, image."""
    n = draw(st.sampled_from([1, 2, 7, 8, 9]))
    c, o = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    h = draw(st.integers(max(1, kernel[0] - 2 * padding[0]), 5))
    w = draw(st.integers(max(1, kernel[1] - 2 * padding[1]), 5))
    return n, c, o, kernel, stride, padding, h, w


@st.composite
def conv2d_sample(draw):
    n, c, o, kernel, stride, padding, h, w = _conv_geometry(draw)
    x, weight, bias = draw(arrays((n, c, h, w))), draw(arrays((o, c) + kernel)), draw(arrays((o,)))
    return Sample((x, weight, bias) if draw(st.booleans()) else (x, weight), dict(stride=stride, padding=padding))


@st.composite
def conv_transpose2d_sample(draw):
    n, cin, cout = draw(st.sampled_from([1, 2, 8])), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    extra = (draw(st.integers(0, stride[0] - 1)), draw(st.integers(0, stride[1] - 1)))
    h, w = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    padding = tuple(draw(st.integers(0, min(2, ((size - 1) * s + k + e - 1) // 2)))
                    for size, s, k, e in zip((h, w), stride, kernel, extra))  # at least one output pixel
    x, weight, bias = draw(arrays((n, cin, h, w))), draw(arrays((cin, cout) + kernel)), draw(arrays((cout,)))
    return Sample((x, weight, bias) if draw(st.booleans()) else (x, weight),
                  dict(stride=stride, padding=padding, output_padding=extra))


@st.composite
def im2col_sample(draw):
    n, c, _, kernel, stride, padding, h, w = _conv_geometry(draw)
    return one(draw(arrays((n, c, h, w))), kernel_size=kernel, stride=stride, padding=padding)


@st.composite
def col2im_sample(draw):
    n, c, _, kernel, stride, padding, h, w = _conv_geometry(draw)
    oh = (h + 2 * padding[0] - kernel[0]) // stride[0] + 1
    ow = (w + 2 * padding[1] - kernel[1]) // stride[1] + 1
    col = draw(arrays((c * kernel[0] * kernel[1], n * oh * ow)))
    return one(col, image_shape=(n, c, h, w), kernel_size=kernel, stride=stride, padding=padding)


CAPSULE_SIZES = st.tuples(*[st.integers(1, 3)] * 5)  # B, I, J, D, K


@st.composite
def capsule_sample(draw, which):
    b, i, j, d, k = draw(CAPSULE_SIZES)
    shapes_of = {"predict": [(b, i, k), (i, j, d, k)], "weighted_sum": [(b, i, j), (b, i, j, d)],
                 "agreement": [(b, i, j, d), (b, j, d)]}[which]
    return Sample(tuple(draw(arrays(s)) for s in shapes_of))


@st.composite
def routing_forward_sample(draw):
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3)))
    return one(draw(arrays(shape)), iterations=draw(st.integers(1, 5)))


def normal(*shape_list, scale=1.0, **kwargs):
    """A fixed case: standard normal arrays of these shapes (times ``scale``), and ``kwargs``."""
    return lambda rng: Sample(tuple(rng.standard_normal(s) * scale for s in shape_list), kwargs)


# ----- NumPy references -----

def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_squash(x, axis=-1):
    squared = (x * x).sum(axis=axis, keepdims=True)
    return squared / (1 + squared) * x / np.sqrt(squared + 1e-8)


def np_reduce(a, reduction):
    return {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction](a)


def np_cross_entropy(x, target, reduction="mean"):
    log_p = np.log(np_softmax(x, 1))
    loss = -(target * log_p).sum(1) if target.dtype.kind == "f" else -log_p[np.arange(len(x)), target]
    return np_reduce(loss, reduction)


def np_binary_cross_entropy(p, target, reduction="mean"):
    loss = -(target * np.maximum(np.log(p), -100) + (1 - target) * np.maximum(np.log(1 - p), -100))
    return np_reduce(loss, reduction)


def np_batch_norm(x, weight=None, bias=None, training=False, running_mean=None, running_var=None, eps=1e-5):
    axes, shape = (0,) + tuple(range(2, x.ndim)), (1, x.shape[1]) + (1,) * (x.ndim - 2)
    mu, var = (x.mean(axis=axes), x.var(axis=axes)) if training else (running_mean, running_var)
    y = (x - mu.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if weight is not None:
        y = y * weight.reshape(shape) + bias.reshape(shape)
    return y


def np_sum_to(x, shape):
    y = x.sum(axis=tuple(range(x.ndim - len(shape))))
    return y.sum(axis=tuple(a for a, n in enumerate(shape) if n == 1 and y.shape[a] != 1), keepdims=True)


def pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


# ----- PyTorch calls that do not map by name -----

def torch_reduce(name):
    def call(torch, x, axis=None, keepdims=False):
        if axis is None:
            axis = tuple(range(x.ndim))
        y = getattr(torch, name)(x, dim=axis, keepdim=keepdims) if x.ndim else getattr(torch, name)(x)
        return y
    return call


def torch_batch_norm(torch, x, weight=None, bias=None, training=False, running_mean=None, running_var=None):
    return torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, training)


def torch_pad(torch, x, pad_width):
    widths = [(pad_width, pad_width)] * x.ndim if isinstance(pad_width, int) else pad_width
    return torch.nn.functional.pad(x, [p for w in reversed(widths) for p in w])


def np_clip(x, low, high):
    return np.clip(x, low, high)


def torch_clamp(torch, x, low, high):
    return torch.clamp(x, low, high)


def batch_norm(x, weight=None, bias=None, **kwargs):
    """F.batch_norm with the affine parameters as the differentiable arguments after x."""
    return F.batch_norm(x, weight=weight, bias=bias, **kwargs)


def dropped_out(x, p):
    tc.manual_seed(7)  # one mask for every call: central differences see a fixed function
    return F.dropout(x, p)


# Kinked ops: values k/10 + 0.03 never sit on a kink (0, -0.5, 0.25, 1.0), nor away_from_zero's on 0.
OFF_ZERO = st.one_of(away_from_zero(), on_grid(0.03))
OFF_UNIT = st.one_of(floats(-2, -1.1), floats(-0.9, 0.9), floats(1.1, 2))


def clipped(name, low, high, off_kinks, min_side=1):
    return OpInfo(name, F.clip, unary(low=low, high=high), np_clip, "clamp", torch_clamp, op="clip",
                  grad_sample=unary(off_kinks, min_side=min_side, low=low, high=high))


def expression(name, fn, sample, ref, torch_name, op, **options):
    """An entry that reaches ``op`` through Tensor operators: PyTorch's tensors take the same expression."""
    return OpInfo(name, fn, sample, ref, torch_name, lambda torch, *args: fn(*args), op=op, **options)


def _elementwise():
    u, any_shape, linear = unary, unary(min_side=0), dict(square_for_second_order=True)
    return [
        OpInfo("neg", F.neg, u(), np.negative, "neg", grad_sample=any_shape, **linear),
        OpInfo("exp", F.exp, u(), np.exp, "exp", grad_sample=any_shape),
        OpInfo("log", F.log, u(floats(0.05, 3.0)), np.log, "log", grad_sample=u(floats(0.05, 3.0), min_side=0)),
        OpInfo("sqrt", F.sqrt, u(floats(0.2, 3.0)), np.sqrt, "sqrt", grad_sample=u(floats(0.2, 3.0), min_side=0)),
        OpInfo("abs", F.abs, u(), np.abs, "abs", grad_sample=u(OFF_ZERO, min_side=0)),
        clipped("clip", -0.5, 1.0, on_grid(0.03)),
        clipped("clip_low", 0.25, None, on_grid(0.03)),
        clipped("clip_high", None, 0.25, on_grid(0.03)),
        clipped("clip_unit", -1.0, 1.0, OFF_UNIT, min_side=0),
        clipped("clip_low_only", 0.0, None, away_from_zero(), min_side=0),
        OpInfo("pow_scalar", F.pow, u(b=3), lambda x, b: x ** b, "pow", lambda t, x, b: t.pow(x, b), op="pow",
               grad_sample=u(min_side=0, b=3)),
        expression("pow_half", lambda x: x ** 0.5, u(floats(0.2, 3.0)), np.sqrt, "Tensor.__pow__", "pow",
                   grad_sample=u(floats(0.2, 3.0), min_side=0)),
        expression("pow_negative", lambda x: x ** -1.5, u(floats(0.3, 3.0)), lambda x: x ** -1.5, "Tensor.__pow__", "pow",
                   grad_sample=u(floats(0.3, 3.0), min_side=0)),
        expression("square", lambda x: x ** 2, u(), np.square, "Tensor.__pow__", "pow", grad_sample=any_shape),
        expression("cube", lambda x: x ** 3, u(), lambda x: x ** 3, "Tensor.__pow__", "pow", grad_sample=any_shape),
        expression("rpow", lambda x: 2.0 ** x, u(), lambda x: 2.0 ** x, "Tensor.__rpow__", "pow", grad_sample=any_shape),
        expression("square_op", lambda x: x * x, u(), np.square, "Tensor.__mul__", "mul", grad_sample=any_shape),
        expression("rsub", lambda x: 1 - x, u(), lambda x: 1 - x, "Tensor.__rsub__", "sub", grad_sample=any_shape, **linear),
        expression("rdiv", lambda x: 1 / x, u(floats(0.1, 2.0)), lambda x: 1 / x, "Tensor.__rtruediv__", "div",
                   grad_sample=u(floats(0.1, 2.0), min_side=0)),
        expression("scalar_arith", lambda x: (3.0 - x) / 2.0 + 1.0 / (x * x + 1.0), u(),
                   lambda x: (3.0 - x) / 2.0 + 1.0 / (x * x + 1.0), "Tensor operators", "div", grad_sample=any_shape),
        OpInfo("add", F.add, binary(), np.add, "add", grad_sample=binary(min_side=0), cases={"rows": normal((4, 3), (3,))},
               **linear),
        OpInfo("sub", F.sub, binary(), np.subtract, "sub", grad_sample=binary(min_side=0),
               cases={"columns": normal((4, 3), (4, 1))}, **linear),
        OpInfo("mul", F.mul, binary(), np.multiply, "mul", grad_sample=binary(min_side=0),
               cases={"columns": normal((4, 3), (4, 1))}),
        OpInfo("div", F.div, binary(right=floats(0.1, 2.0)), np.divide, "div", grad_sample=st.one_of(
            binary(right=floats(0.1, 2.0)), binary(right=away_from_zero(0.5, 2.0), min_side=0))),
        # PyTorch's pow backward zeroes d(d/da)/db where the exponent is 0 (a masked_fill): not a derivative
        OpInfo("pow", F.pow, binary(floats(0.1, 2.0), floats(0.1, 2.0)), np.power, "pow", grad_sample=st.one_of(
            binary(floats(0.1, 2.0), floats(0.1, 2.0)), binary(floats(0.5, 2.0), min_side=0)),
            torch_agrees=lambda sample: not np.any(sample.args[1] == 0)),
        OpInfo("maximum", F.maximum, binary(), np.maximum, "maximum", grad_sample=binary(on_grid(0.05), on_grid(0.0), min_side=0)),
        OpInfo("minimum", F.minimum, binary(), np.minimum, "minimum", grad_sample=binary(on_grid(0.05), on_grid(0.0), min_side=0)),
        expression("operator_add", lambda a, b: a + b, binary(), np.add, "Tensor.__add__", "add", **linear),
        expression("operator_sub", lambda a, b: a - b, binary(), np.subtract, "Tensor.__sub__", "sub", **linear),
        expression("operator_mul", lambda a, b: a * b, binary(), np.multiply, "Tensor.__mul__", "mul"),
        expression("operator_truediv", lambda a, b: a / b, binary(right=floats(0.1, 2.0)), np.divide, "Tensor.__truediv__",
                   "div"),
        OpInfo("where", lambda a, b, condition: F.where(condition, a, b), where_sample(),
               lambda a, b, condition: np.where(condition, a, b), "where", lambda t, a, b, condition: t.where(condition, a, b),
               **linear),
    ]


def _activations():
    return [
        OpInfo("relu", F.relu, unary(), lambda x: np.maximum(x, 0), "relu", grad_sample=unary(OFF_ZERO, min_side=0)),
        OpInfo("leaky_relu", F.leaky_relu, unary(), lambda x: np.where(x > 0, x, 0.01 * x), "nn.functional.leaky_relu",
               grad_sample=unary(on_grid(0.03))),
        OpInfo("leaky_relu_0.2", F.leaky_relu, unary(negative_slope=0.2),
               lambda x, negative_slope: np.where(x > 0, x, negative_slope * x), "nn.functional.leaky_relu", op="leaky_relu",
               grad_sample=unary(OFF_ZERO, min_side=0, negative_slope=0.2),
               cases={"3x4": lambda rng: one(rng.standard_normal((3, 4)), negative_slope=0.2)}),
        OpInfo("sigmoid", F.sigmoid, unary(floats(-30, 30)), lambda x: 1 / (1 + np.exp(-x)), "sigmoid",
               grad_sample=unary(st.one_of(floats(-4.0, 4.0), floats(-30, 30)), min_side=0)),
        OpInfo("tanh", F.tanh, unary(), np.tanh, "tanh", grad_sample=unary(floats(-3.0, 3.0), min_side=0)),
        OpInfo("softmax", F.softmax, along_an_axis(), np_softmax, "softmax", kernel=True, cases={
            "axis0": lambda rng: one(rng.standard_normal((3, 5)), axis=0),
            "rows": lambda rng: one(rng.standard_normal((5, 3, 4)), axis=-1)}),
        OpInfo("log_softmax", F.log_softmax, along_an_axis(), lambda x, axis: np.log(np_softmax(x, axis)), "log_softmax",
               tol=dict(rtol=1e-11, atol=1e-12), cases={"axis1": lambda rng: one(rng.standard_normal((3, 5)), axis=1)}),
        # The squash bends on the scale of |s|: near 0 a central difference of step 1e-6 misreads its
        # second derivative, so the gradient's entries stay off 0 (engine/test_grad_nn_ops.py tests 0 itself).
        OpInfo("squash", F.squash, along_an_axis(), np_squash, grad_sample=along_an_axis(away_from_zero(0.01)), kernel=True,
               cases={"axis1": lambda rng: one(rng.standard_normal((3, 4)), axis=1),
                      "rows": lambda rng: one(rng.standard_normal((5, 3, 4)), axis=-1),
                      "tiny_rows": lambda rng: one(rng.standard_normal((5, 3, 4)) * 1e-3, axis=2)},
               not_tested={"torch": "no PyTorch op: oracles/torch_reference.py writes the squash out for the model tests"}),
    ]


def _reductions():
    entries = []
    for name, ref, extreme in (("sum", np.sum, False), ("mean", np.mean, False), ("max", np.max, True), ("min", np.min, True)):
        entries.append(OpInfo(
            name, getattr(F, name), reduction_forward(), ref, "amax" if name == "max" else "amin" if name == "min" else name,
            torch_reduce({"max": "amax", "min": "amin"}.get(name, name)), tol=dict(rtol=1e-11, atol=1e-12),
            grad_sample=reduction_grad(on_grid(), unique=True) if extreme else reduction_grad(),  # extremes: distinct by >= 0.1
            square_for_second_order=not extreme,
            cases={"axis1": lambda rng: one(rng.standard_normal((3, 4)), axis=1)} if name == "max" else {}))
    return entries


def _shapes():
    def as_perm(t, x, axes=None):
        return x.permute(axes if axes is not None else tuple(reversed(range(x.ndim))))

    def squeeze(t, x, axis=None):
        return t.squeeze(x) if axis is None else t.squeeze(x, axis)

    shape_op = dict(square_for_second_order=True)
    return [
        OpInfo("reshape", F.reshape, reshape_sample(), lambda x, shape: x.reshape(shape), "reshape", **shape_op),
        OpInfo("flatten", F.flatten, flatten_sample(), lambda x, start_axis: x.reshape(x.shape[:start_axis] + (-1,)),
               "flatten", lambda t, x, start_axis: t.flatten(x, start_axis), **shape_op),
        OpInfo("transpose", F.transpose, permutation_sample(allow_none=True), np.transpose, "permute", as_perm, **shape_op),
        OpInfo("permute", F.permute, permutation_sample(), np.transpose, "permute", as_perm, **shape_op),
        OpInfo("swapaxes", F.swapaxes, swapaxes_sample(), np.swapaxes, "swapaxes",
               lambda t, x, axis1, axis2: t.swapaxes(x, axis1, axis2), **shape_op),
        OpInfo("expand_dims", F.expand_dims, expand_dims_sample(), np.expand_dims, "unsqueeze", **shape_op),
        OpInfo("squeeze", F.squeeze, squeeze_sample(), np.squeeze, "squeeze", squeeze, **shape_op),
        OpInfo("getitem", F.getitem, getitem_sample(), lambda x, index: x[index], **shape_op, cases={
            "rows_repeated": lambda rng: one(rng.standard_normal((3, 4)), index=(np.array([0, 0, 2]),))},
            not_tested={"torch": "PyTorch's indexing refuses negative steps; NumPy is the reference"}),
        OpInfo("concatenate", F.concatenate, concatenate_sample(), np.concatenate, "cat", **shape_op),
        OpInfo("stack", F.stack, stack_sample(), np.stack, "stack", **shape_op),
        OpInfo("pad", F.pad, pad_sample(), np.pad, "nn.functional.pad", torch_pad, **shape_op,
               cases={"by_1": lambda rng: one(rng.standard_normal((3, 4)), pad_width=1)}),
        OpInfo("broadcast_to", F.broadcast_to, broadcast_to_sample(), np.broadcast_to, "broadcast_to",
               lambda t, x, shape: t.broadcast_to(x, shape), **shape_op,
               cases={"3x1": lambda rng: one(rng.standard_normal((3, 1)), shape=(2, 3, 4))}),
        OpInfo("sum_to", F.sum_to, sum_to_sample(), np_sum_to, "Tensor.sum_to_size",
               lambda t, x, shape: x.sum_to_size(shape), **shape_op),
        OpInfo("identity", F.identity, unary(), lambda x: x, "nn.Identity", lambda t, x: t.nn.Identity()(x), **shape_op),
        OpInfo("copy", F.copy, unary(), np.copy, "clone", **shape_op),
        OpInfo("cast32", F.cast, unary(dtype=np.float32), lambda x, dtype: x.astype(dtype), "Tensor.to",
               lambda t, x, dtype: x.to(t.float32), op="cast", not_tested={
                   "grad": "a float32 result: central differences of step 1e-6 drown in its rounding "
                           "(engine/test_grad_shape_reduce.py checks the gradient comes back in the input dtype)"}),
        OpInfo("to_device", F.to_device, unary(device="cpu"), lambda x, device: x, "Tensor.to",
               lambda t, x, device: x.to(device), **shape_op, not_tested={
                   "gpu": "moves between devices: test_gpu_ops.py's device-move test and engine/test_devices.py"}),
    ]


def _nn():
    return [
        OpInfo("matmul", F.matmul, matmul_sample(), np.matmul, "matmul", cases={
            "broadcast": normal((2, 1, 3, 4), (5, 4, 2)), "batched": normal((2, 3, 4), (4, 5))}),
        OpInfo("linear", F.linear, linear_sample(), lambda x, w, b=None: x @ w.T + (0.0 if b is None else b),
               "nn.functional.linear", cases={"3d_no_bias": normal((2, 3, 5), (2, 5))}),
        OpInfo("mse_loss", F.mse_loss, pair_sample(), lambda x, y, reduction: np_reduce((x - y) ** 2, reduction),
               "nn.functional.mse_loss"),
        OpInfo("binary_cross_entropy", F.binary_cross_entropy, pair_sample(floats(0.02, 0.98), floats(0.0, 1.0)),
               np_binary_cross_entropy, "nn.functional.binary_cross_entropy", tol=dict(rtol=1e-11, atol=1e-12),
               # second derivatives of terms up to 1/p^2 = 2500 cancel: float64 keeps about 1e-10 of them
               oracle_tol=dict(rtol=1e-8, atol=1e-8),
               grad_sample=pair_sample(floats(0.1, 0.9), floats(0.0, 1.0)), cases={
                   "sigmoids": lambda rng: Sample(tuple(1 / (1 + np.exp(-rng.standard_normal((3, 4)))) for _ in "pt"))}),
        OpInfo("cross_entropy", F.cross_entropy, cross_entropy_sample(), np_cross_entropy, "nn.functional.cross_entropy",
               tol=dict(rtol=1e-11, atol=1e-12), cases={
                   "labels": lambda rng: one(rng.standard_normal((3, 4)), target=np.array([1, 0, 3])),
                   "labels_4x3": lambda rng: one(rng.standard_normal((4, 3)), target=np.array([0, 2, 1, 2]))}),
        OpInfo("cross_entropy_soft", F.cross_entropy, cross_entropy_sample(soft=True), np_cross_entropy,
               "nn.functional.cross_entropy", op="cross_entropy", tol=dict(rtol=1e-11, atol=1e-12)),
        OpInfo("one_hot", F.one_hot, one_hot_sample(), lambda labels, num_classes: np.eye(num_classes, dtype=np.float32)[labels],
               "nn.functional.one_hot", lambda t, labels, num_classes: t.nn.functional.one_hot(labels, num_classes).float(),
               not_tested={"grad": "integer labels in, constant 0/1 out: nothing to differentiate"}),
        OpInfo("batch_norm", batch_norm, batch_norm_sample(True), np_batch_norm, "nn.functional.batch_norm",
               torch_batch_norm, tol=dict(rtol=1e-10, atol=1e-12),
               grad_sample=batch_norm_sample(True, on_grid(), unique=True),  # spread out: no near-zero variance
               cases={"4x3x2x2": normal((4, 3, 2, 2), (3,), (3,), training=True)}),
        OpInfo("batch_norm_eval", batch_norm, batch_norm_sample(False), np_batch_norm, "nn.functional.batch_norm",
               torch_batch_norm, op="batch_norm", tol=dict(rtol=1e-10, atol=1e-12)),
        OpInfo("dropout", dropped_out, unary(p=0.4), op="dropout", square_for_second_order=True, not_tested={
            "forward": "a random mask: test_forward_values.py checks the kept fraction and the scale",
            "gpu": "each device draws its own mask", "torch": "PyTorch draws its own mask"}),
    ]


def _conv():
    def conv2d_ref(x, w, b=None, stride=1, padding=0):
        return naive_conv2d(x, w, b, pair(stride), pair(padding))

    def conv_transpose2d_ref(x, w, b=None, stride=1, padding=0, output_padding=0):
        return naive_conv_transpose2d(x, w, b, pair(stride), pair(padding), pair(output_padding))

    columns = ("the column order is the device's own (batch innermost on NumPy from a batch of 8, never on CuPy): "
               "conv2d and conv_transpose2d run it on the GPU, tests/kernels/ test its kernels")
    unfold = "PyTorch's unfold/fold lay the columns out (N, C*kh*kw, L)"
    conv = dict(kernel=True, tol=dict(rtol=1e-10, atol=1e-12), grad_tol=dict(max_elementwise=40, directions=3))
    return [
        OpInfo("conv2d", F.conv2d, conv2d_sample(), conv2d_ref, "nn.functional.conv2d", **conv, cases={
            "stride2_pad1_bias": normal((2, 3, 7, 7), (4, 3, 3, 3), (4,), stride=2, padding=1),
            "stride2_pad1": normal((2, 3, 9, 9), (4, 3, 3, 3), stride=2, padding=1)}),
        OpInfo("conv_transpose2d", F.conv_transpose2d, conv_transpose2d_sample(), conv_transpose2d_ref,
               "nn.functional.conv_transpose2d", **conv, cases={
                   "stride2_pad1_extra1": normal((2, 3, 4, 4), (3, 2, 3, 3), stride=2, padding=1, output_padding=1)}),
        OpInfo("im2col", F.im2col, im2col_sample(), lambda x, kernel_size, stride, padding: naive_im2col(
            x, kernel_size, stride, padding), square_for_second_order=True, not_tested={"gpu": columns, "torch": unfold},
            **conv),
        OpInfo("col2im", F.col2im, col2im_sample(), lambda col, image_shape, kernel_size, stride, padding: naive_col2im(
            col, image_shape, kernel_size, stride, padding), square_for_second_order=True,
            not_tested={"gpu": columns, "torch": unfold}, **conv),
    ]


def _capsules():
    def einsum(equation):
        return lambda *arrays: np.einsum(equation, *arrays)

    def torch_einsum(equation):
        return lambda torch, *tensors: torch.einsum(equation, *tensors)

    capsule = dict(kernel=True, square_for_second_order=True, tol=dict(rtol=1e-12, atol=1e-14))
    return [
        OpInfo("capsule_predict", F.capsule_predict, capsule_sample("predict"), lambda u, w: np.einsum("ijdk,bik->bijd", w, u),
               "einsum", lambda torch, u, w: torch.einsum("ijdk,bik->bijd", w, u), **capsule),
        OpInfo("routing_weighted_sum", F.routing_weighted_sum, capsule_sample("weighted_sum"), einsum("bij,bijd->bjd"),
               "einsum", torch_einsum("bij,bijd->bjd"), **capsule),
        OpInfo("routing_agreement", F.routing_agreement, capsule_sample("agreement"), einsum("bijd,bjd->bij"),
               "einsum", torch_einsum("bijd,bjd->bij"), **capsule),
        OpInfo("routing_forward", F.routing_forward, routing_forward_sample(), lambda u_hat, iterations: route(u_hat, iterations)[0],
               kernel=True, not_tested={
                   "forward": "no NumPy path: one kernel launch, on the GPU (checked here against NumPy's Procedure 1) "
                              "or on the kernels' CPU emulation (kernels/test_kernels_emulation.py)",
                   "grad": "forward only: it records no graph (GraphError); routing's gradient is derived op by op "
                           "(models/test_routing_reference.py)",
                   "torch": "no PyTorch op; oracles/torch_reference.py routes op by op for the model tests"}),
    ]


OPS = _elementwise() + _activations() + _reductions() + _shapes() + _nn() + _conv() + _capsules()

# Public names of functional that are not tensor ops, and why they have no entry.
NOT_OPS = {
    "conv_output_size": "integer arithmetic on sizes, no tensors (engine/test_op_arguments.py checks its use)",
    "fused_routing_available": "a yes/no query about routing_forward's kernel path, no tensors",
}


def ids(values):
    """Readable test ids: the entry's name, or name-case for (op, case) pairs."""
    return [f"{v[0].name}-{v[1]}" if isinstance(v, tuple) else v.name for v in values]
