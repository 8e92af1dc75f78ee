"""A node of the tape: :class:`Function`, what it saves for its backward, and the version checks
that catch an in-place update of what it saved."""
from __future__ import annotations

import itertools
import weakref

import numpy as np

from ..backend import absolute_device_of, device_of, is_cupy_array, on_device_of
from ..errors import DeviceError, GraphError, ShapeError
from .grad_mode import _state


class _InputInfo:
    """What a node remembers of an input it did not save: shape, dtype, device (no array). The
    device is "cpu" or "cuda:N", never "cuda": backward may run while another GPU is current."""

    __slots__ = ("shape", "dtype", "device", "_op", "_index")

    def __init__(self, x, op, index):
        self.shape, self.dtype, self.device = x.data.shape, x.data.dtype, absolute_device_of(x.data)
        self._op, self._index = op, index

    @property
    def ndim(self):
        return len(self.shape)

    def __getattr__(self, name):
        raise GraphError(
            f"{self._op}.backward read '{name}' of input {self._index}, which it did not save; "
            f"list the input in {self._op}.save_inputs"
        )


_sequence_numbers = itertools.count(1)


class Function:
    """One differentiable op and, once called on inputs that need gradients, one node of the graph.

    Subclasses implement ``forward(*arrays) -> array`` on raw NumPy/CuPy arrays and
    ``backward(grad_output: Tensor) -> Tensor | tuple[Tensor | None, ...]`` with differentiable
    ops. In ``backward``: ``self.inputs`` (the saved input Tensors; the others expose only
    ``shape``, ``dtype``, ``ndim`` and ``device``), ``self.needs_grad`` (one bool per input) and
    ``self.output()`` (the output Tensor, when ``save_output``).

    What a node keeps for its backward (memory):
        save_inputs: indices of the inputs whose values backward reads; None keeps them all (the
            safe default for new ops). ``inputs_to_save(needs_grad)`` may refine it per call.
        save_output: True when backward calls ``self.output()``.
        keep_for_backward(arrays, y): stores forward-time state (a mask); runs only when the node
            is recorded, never under ``no_grad``.
    """

    save_inputs = None
    save_output = False
    released = False
    sequence = 0  # the order in which recorded nodes were created (backward runs later ones first)
    site = None   # where user code created it, under detect_anomaly
    scope = None  # the graph.scope label it was recorded under (routing iterations, in drawings)
    _hooks = None

    @property
    def name(self) -> str:
        return type(self).__name__

    def inputs_to_save(self, needs_grad):
        """Indices of the inputs backward will read, given which inputs need a gradient."""
        return self.save_inputs

    def keep_for_backward(self, arrays, y):
        """Store forward-time state that backward needs (called only when the node is recorded)."""

    def __call__(self, *inputs):
        state = _state
        if state.observer is not None:  # the one check that instruments cost an op (observers.py)
            return _observed_call(self, inputs, state)
        arrays = [x.data for x in inputs]
        if len(arrays) > 1:
            _check_same_device(self.name, arrays)
        try:
            if arrays and type(arrays[0]) is not np.ndarray and is_cupy_array(arrays[0]):
                with arrays[0].device:  # run on the GPU that holds the data, not the current one
                    y = self.forward(*arrays)
            else:
                y = self.forward(*arrays)
        except ValueError as exc:
            if isinstance(exc, ShapeError) or not _is_shape_mismatch(exc):
                raise
            shapes = ", ".join(str(tuple(a.shape)) for a in arrays)
            raise ShapeError(f"{self.name}: {exc} (input shapes {shapes})") from exc
        out = Tensor._wrap(y)
        if getattr(y, "base", None) is not None:
            _share_version_with_base(out, inputs, arrays)
        if state.grad_enabled:
            needs = tuple(x.requires_grad for x in inputs)
            if any(needs):
                if type(y) is np.ndarray:
                    self._record(inputs, arrays, needs, out, y)
                else:
                    with on_device_of(y):  # keep_for_backward may compute (ReLU's mask) on the output's GPU
                        self._record(inputs, arrays, needs, out, y)
        return out

    def _record(self, inputs, arrays, needs, out, y):
        self.sequence = next(_sequence_numbers)
        if _state.scope is not None:
            self.scope = _state.scope
        self.needs_grad = needs
        # where backward runs: the GPU holding the output (CuPy computes on the current GPU)
        self.output_device = y.device if type(y) is not np.ndarray and is_cupy_array(y) else None
        self.next = tuple(x.creator if x.creator is not None else (x if x.requires_grad else None) for x in inputs)
        keep = self.inputs_to_save(needs)
        if keep is None:
            self.inputs = inputs
            self._saved_versions = tuple(x._version for x in inputs)
        else:
            self.inputs = tuple(x if k in keep else _InputInfo(x, self.name, k) for k, x in enumerate(inputs))
            self._saved_versions = tuple(x._version if k in keep else None for k, x in enumerate(inputs))
        if self.save_output:
            counter = out._shared_version_counter()
            self._saved_output, self._output_vc, self._output_version = y, counter, counter[0]
        self.keep_for_backward(arrays, y)
        self._output = weakref.ref(out)
        out.creator = self
        out.requires_grad = True

    def forward(self, *arrays):
        raise NotImplementedError

    def backward(self, grad_output):
        raise NotImplementedError

    def output(self):
        """The output Tensor of this node, part of the graph (rebuilt from the saved array if it was dropped)."""
        out = self._output() if self.__dict__.get("_output") is not None else None
        if out is not None:
            return out
        data = self.__dict__.get("_saved_output")
        if data is None:
            raise GraphError(f"{self.name}.backward needs its output, which it did not save (set save_output = True)")
        out = Tensor._wrap(data)
        out.creator, out.requires_grad, out._vc = self, True, self._output_vc
        return out

    def describe(self, inputs=None) -> str:
        inputs = self.__dict__.get("inputs") if inputs is None else inputs
        shapes = ", ".join(str(tuple(x.shape)) for x in inputs) if inputs is not None else "?"
        where = f", created at {self.site}" if self.site else ""
        return f"op {self.name} (input shapes {shapes}{where})"

    def check_versions(self):
        """Raise GraphError if a tensor this node saved was modified in place since the forward."""
        for x, saved in zip(self.inputs, self._saved_versions):
            if saved is not None and x._version != saved:
                raise GraphError(
                    f"{self.name}: an input of shape {tuple(x.shape)} was modified in place after the forward "
                    f"(version {saved} -> {x._version}); backward would use the new values"
                )
        if self.save_output and self._output_vc[0] != self._output_version:
            raise GraphError(
                f"{self.name}: its output of shape {tuple(self._saved_output.shape)} was modified in place after "
                f"the forward (version {self._output_version} -> {self._output_vc[0]})"
            )

    def release(self):
        """Drop what this node holds (inputs, saved arrays); a later backward through it raises GraphError."""
        site = self.site
        vars(self).clear()
        self.released = True
        self.site = site


# What NumPy and CuPy say in a ValueError when operands' shapes do not combine (broadcasting,
# matmul, dot, reshape, concatenate, stack, squeeze, transpose); AxisError aside, a forward's other
# ValueErrors (a bad value, a DeviceError) are not about shapes.
_SHAPE_MISMATCH_MESSAGES = ("broadcast", "not aligned", "mismatch", "cannot reshape", "dimension", "same shape",
                            "squeeze", "repeated axis", "axes don't match")


def _is_shape_mismatch(exc: ValueError) -> bool:
    """Whether a ValueError that NumPy or CuPy raised in a forward says the operands' shapes do not combine."""
    if isinstance(exc, DeviceError):  # also a ValueError
        return False
    if isinstance(exc, np.exceptions.AxisError):
        return True
    message = str(exc).lower()
    return any(fragment in message for fragment in _SHAPE_MISMATCH_MESSAGES)


_NONE = itertools.repeat(None)


def edges(fn, grads=None):
    """The edges from recorded node ``fn`` back to its inputs, filtered in the one way that the
    walk, anomaly mode and the hooked-leaf bookkeeping all need.

    Yields ``(needed, grad, edge, x, shape_error)`` in input order:
        needed: a gradient goes along this edge (the input needs one, so it leads to a node or leaf);
        grad: the gradient for the input in ``grads`` (``fn``'s backward results), or None;
        edge: the node that made the input, the input itself (a leaf), or None;
        x: the input, or what ``fn`` remembers of it (shape, dtype);
        shape_error: a GraphError when ``grad`` does not have ``x``'s shape (the walk raises it), else None.
    Without ``grads``: every edge, with no grad. With ``grads``: only the needed edges for which
    ``fn``'s backward returned a gradient.
    """
    if grads is None:  # (an input that needs a gradient always has an edge: _record)
        return zip(fn.needs_grad, _NONE, fn.next, fn.inputs, _NONE)
    return _edges_with_grads(fn, grads)


def _edges_with_grads(fn, grads):
    for x, gx, need, edge in zip(fn.inputs, grads, fn.needs_grad, fn.next):
        if not need or gx is None or edge is None:
            continue
        if gx.shape == x.shape:
            yield True, gx, edge, x, None
        else:
            yield True, gx, edge, x, GraphError(f"{fn.name}.backward returned a gradient of shape {gx.shape} "
                                                f"for an input of shape {tuple(x.shape)}")


def _observed_call(fn, inputs, state):
    """``fn(*inputs)`` told to this thread's observers: to all of them when user code called it,
    to those that watch backward ops too when a node's backward did."""
    observers = state.observer
    observer = observers if state.backward_node is None else state.backward_observer
    start = observer.clock([x.data for x in inputs]) if observer is not None else 0.0
    state.observer = None  # the call itself, unobserved (a forward works on arrays: it calls no op)
    try:
        out = fn(*inputs)
    finally:
        state.observer = observers
    if observer is not None:
        observer.forward_recorded(fn, inputs, out, start)
    return out


def _share_version_with_base(out, inputs, arrays):
    """A view of an input shares that input's version counter (an update of one is an update of both)."""
    base = out.data.base
    for x, a in zip(inputs, arrays):
        if a is base or getattr(a, "base", None) is base:
            out._vc = x._shared_version_counter()
            return


def _check_same_device(name, arrays):
    first = arrays[0]
    for a in arrays[1:]:
        if type(a) is np.ndarray and type(first) is np.ndarray:
            continue
        if device_of(a) != device_of(first):  # NumPy and CuPy, or two GPUs
            raise DeviceError(
                f"{name}: operands are on different devices: {device_of(arrays[0])} and {device_of(a)};"
                " move them with .to(device) first"
            )


from ..tensor import Tensor  # noqa: E402  (tensor.py builds on this package; imported last to close the cycle)
