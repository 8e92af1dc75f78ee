"""The tape: one :class:`Function` node per op, and the reverse-mode walk over them.

Each op's output Tensor points to the Function that made it (``creator``). A node points to the
nodes that made its inputs (``next``; a leaf that requires grad stands for itself), and keeps
only what its backward reads: the inputs it names in ``save_inputs`` (``x + y``, ``sum(x)`` and
``reshape(x)`` keep none, only shapes), its output's array if ``save_output``, and whatever
``keep_for_backward`` stores (a ReLU's boolean mask). Dropping the outputs drops the graph; no
global tape grows.

``backward`` orders the nodes topologically with an explicit stack (no recursion, so a chain of
any length works), sums the gradient arriving at each node, runs hooks, and calls each node's
``backward``, which is written with differentiable ops, so with ``create_graph=True`` the
gradients carry a graph of their own. A node frees what it holds right after its backward ran
(unless ``retain_graph``), and a gradient is freed as soon as its node consumed it. Without
``create_graph`` a backward may hand over a :class:`DeferredGradient` instead of a Tensor (routing's
u_hat gradients, kept as their small factors); the walk merges those arriving at one tensor and
builds the sum once, so every hook, ``.grad`` and node still receives a Tensor.

Semantics a PyTorch user relies on:
- grad mode and anomaly mode are thread-local; a new thread starts with grad on, anomaly off;
- the gradient reaching a tensor has that tensor's dtype and shape (cast where it accumulates);
- every ``.grad`` is its own writeable array: backward never hands one array to two tensors and
  never mutates the inputs or the seed gradient;
- a node records the version of each tensor it saved; an in-place update made through the engine
  (``Tensor.add_`` etc., optimizer steps, ``load_state_dict``) before its backward raises
  :class:`GraphError` there instead of silently producing a wrong gradient.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import sys
import threading
import traceback
import weakref

import numpy as np

from ._parallel import add_into, binary
from .backend import absolute_device_of, array_module, device_of, is_cupy_array, on_device_of
from .errors import AnomalyError, DeviceError, GraphError, ShapeError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class _ThreadState(threading.local):
    """Per-thread modes; the class attributes are what every new thread starts with."""

    grad_enabled = True
    anomaly = False
    backward_node = None  # the node whose backward is running in this thread
    profiler = None       # the active tinygrad_caps.profiler.Profile of this thread

    def __init__(self):
        self.previous_grad_modes = []


_state = _ThreadState()

# How many gradient arrays backward copied because they were not its own (a view, read-only, or
# shared with another gradient); reported by benchmarks/engine_overhead.py.
stats = {"grad_copies": 0}


def is_grad_enabled() -> bool:
    """True when ops record the graph in this thread (not inside ``no_grad``)."""
    return _state.grad_enabled


def is_anomaly_enabled() -> bool:
    """True inside ``detect_anomaly`` in this thread."""
    return _state.anomaly


class _GradMode(contextlib.ContextDecorator):
    """Sets grad mode on enter and restores the previous mode on exit, also when the body raises.

    The previous modes live on a per-thread stack, not on this object, and each decorated call
    gets a fresh context (``_recreate_cm``), so nesting, recursion, re-entrancy and threads all
    restore exactly what they found.
    """

    def __init__(self, enabled: bool):
        self.enabled = bool(enabled)

    def _recreate_cm(self):
        return type(self)(self.enabled)

    def __enter__(self):
        state = _state
        state.previous_grad_modes.append(state.grad_enabled)
        state.grad_enabled = self.enabled
        return self

    def __exit__(self, *exc):
        state = _state
        state.grad_enabled = state.previous_grad_modes.pop()
        return False


def no_grad():
    """Context manager and decorator inside which ops record no graph (this thread only)."""
    return _GradMode(False)


def enable_grad():
    """Context manager and decorator that turns recording back on (e.g. inside ``no_grad``)."""
    return _GradMode(True)


def set_grad_enabled(enabled: bool):
    """Context manager and decorator: record the graph iff ``enabled``."""
    return _GradMode(enabled)


@contextlib.contextmanager
def detect_anomaly():
    """Context (this thread) in which the first op whose forward or backward output holds NaN/Inf raises AnomalyError.

    The error names the op, the shapes of its inputs and the line of user code that created it.
    Costs a stack walk per op and a finiteness check per output: use it to debug, not to train.
    """
    previous = _state.anomaly
    _state.anomaly = True
    try:
        yield
    finally:
        _state.anomaly = previous


def _user_code_site() -> str:
    """'file:line in function: code' of the innermost frame outside this package."""
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR):
            return f"{frame.filename}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"
    return "<unknown>"


def _has_nonfinite(array) -> bool:
    if array.dtype.kind not in "fc":
        return False
    with on_device_of(array):
        return not bool(array_module(array).isfinite(array).all())


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
    site = None
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
        arrays = [x.data for x in inputs]
        if len(arrays) > 1:
            _check_same_device(self.name, arrays)
        if state.anomaly:
            self.site = _user_code_site()
        profiler = state.profiler if state.backward_node is None else None
        start = profiler.clock(arrays) if profiler is not None else 0.0
        try:
            if arrays and type(arrays[0]) is not np.ndarray and is_cupy_array(arrays[0]):
                with arrays[0].device:  # run on the GPU that holds the data, not the current one
                    y = self.forward(*arrays)
            else:
                y = self.forward(*arrays)
        except ValueError as exc:
            if isinstance(exc, (ShapeError, DeviceError)):  # a DeviceError (also a ValueError) is no shape error
                raise
            shapes = ", ".join(str(tuple(a.shape)) for a in arrays)
            raise ShapeError(f"{self.name}: {exc} (input shapes {shapes})") from exc
        if state.anomaly and _has_nonfinite(y):
            node = state.backward_node
            if node is not None:
                raise AnomalyError(f"{node.describe()} produced NaN or Inf in its backward (in {self.name})")
            raise AnomalyError(f"{self.describe(inputs)} produced NaN or Inf in its forward output")
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
        if profiler is not None:
            profiler.record_forward(self.name, start, y, arrays)
        return out

    def _record(self, inputs, arrays, needs, out, y):
        self.sequence = next(_sequence_numbers)
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


def _topological_order(roots):
    """Functions reachable from ``roots``, each after every node that consumes its output.

    Among the nodes whose consumers are all done, the one created last in the forward runs first
    (as PyTorch's engine does). So a branch that only leads to a parameter (``W.T`` in a linear
    layer) runs right after its consumer and that parameter's gradient is complete early, while
    the long branch back to the input is still ahead (data-parallel training overlaps on this).
    """
    nodes, consumers, stack = {}, {}, list(roots)
    while stack:
        fn = stack.pop()
        if id(fn) in nodes:
            continue
        if fn.released:
            raise GraphError(
                f"backward through a graph that was already freed (op {fn.name}); "
                "pass retain_graph=True to the first backward to keep it"
            )
        nodes[id(fn)] = fn
        for edge in fn.next:
            if isinstance(edge, Function):
                consumers[id(edge)] = consumers.get(id(edge), 0) + 1
                stack.append(edge)
    ready = [(-fn.sequence, key) for key, fn in nodes.items() if not consumers.get(key)]
    heapq.heapify(ready)
    order = []
    while ready:
        fn = nodes[heapq.heappop(ready)[1]]
        order.append(fn)
        for edge in fn.next:
            if isinstance(edge, Function):
                consumers[id(edge)] -= 1
                if not consumers[id(edge)]:
                    heapq.heappush(ready, (-edge.sequence, id(edge)))
    return order


def _run_hooks(hooks, grad):
    for hook in hooks or ():
        replaced = hook(grad)
        if replaced is not None:
            grad = replaced
    return grad


class DeferredGradient:
    """A gradient that a backward hands over unevaluated, so that the walk can sum several of them
    at once instead of building and adding each.

    A backward may return one for an input only when nothing is being recorded (no
    ``create_graph``). The walk merges it with the deferred gradients already waiting for that
    input (``merge``), and turns the sum into a Tensor when one is needed (``materialize``: before
    the receiving node's backward, for hooks, ``.grad`` and anomaly checks). Subclasses set
    ``shape`` and ``dtype`` and implement ``materialize``; ``merge`` returns None for gradients it
    cannot combine with.
    """

    shape: tuple = ()
    dtype = None

    def materialize(self) -> Tensor:
        """The gradient as a new Tensor with its own array."""
        raise NotImplementedError

    def merge(self, other):
        """A deferred gradient equal to ``self + other``, or None when the two do not combine."""
        return None

    def add_to(self, array) -> None:
        """``array += gradient``, in place (``array`` has this gradient's shape and dtype)."""
        add_into(array, self.materialize().data)


GRADIENT_SUMS = "(gradient sums)"  # the profiler's row for the walk's own work: summing the paths into a tensor


def _materialized(g):
    return g.materialize() if isinstance(g, DeferredGradient) else g


class _GradientBuffers:
    """The gradients flowing to each node or leaf, summed as they arrive.

    The first gradient to arrive is stored as it is (it may be another tensor's upstream
    gradient, so it is never written to); the second allocates one sum that this walk owns, and
    every later one is added into that sum in place. Without ``create_graph``, a tensor reached
    by five paths (u_hat in full-gradient routing) costs one new array, not four. Deferred
    gradients that combine (routing's five products into u_hat) wait as one and are built at once.
    """

    def __init__(self, create_graph, profiler=None):
        self.create_graph, self.profiler = create_graph, profiler
        self.grads, self.owned = {}, set()
        self.deferred = 0  # how many entries wait as a DeferredGradient

    def add(self, key, g):
        if key not in self.grads:  # the first gradient to arrive is only stored
            self.grads[key] = g
            self.deferred += isinstance(g, DeferredGradient)
            return
        if self.profiler is None:
            self._add(key, g)
            return
        before = self.grads[key]
        start = self.profiler.clock(_arrays_of(g))
        self._add(key, g)
        after = self.grads[key]  # a new Tensor when a sum was allocated or a deferred one built
        self.profiler.record_gradient_sum(GRADIENT_SUMS, start, after, created=after is not before)

    def _add(self, key, g):
        if isinstance(g, Tensor) and type(g.data) is not np.ndarray:
            with on_device_of(g.data):  # a gradient that crossed devices (.to) is summed where it lives
                self._sum(key, g)
        else:
            self._sum(key, g)

    def _sum(self, key, g):
        old = self.grads[key]
        if self.create_graph:
            self.grads[key] = old + g
            return
        if isinstance(old, DeferredGradient) and isinstance(g, DeferredGradient):
            merged = old.merge(g)
            if merged is not None:
                self.grads[key] = merged
                return
        if key not in self.owned:
            if isinstance(old, DeferredGradient):  # built now, into an array nobody else holds
                old = self.grads[key] = old.materialize()
                self.deferred -= 1
            else:
                self.grads[key] = Tensor._wrap(binary(np.add, old.data, _materialized(g).data))
                self.owned.add(key)
                return
            self.owned.add(key)
        if isinstance(g, DeferredGradient):
            g.add_to(old.data)
        else:
            old.data = add_into(old.data, g.data)

    def pop(self, key):
        self.owned.discard(key)
        g = self.grads.pop(key, None)
        if not isinstance(g, DeferredGradient):
            return g
        self.deferred -= 1
        start = self.profiler.clock() if self.profiler is not None else 0.0
        g = g.materialize()
        if self.profiler is not None:
            self.profiler.record_gradient_sum(GRADIENT_SUMS, start, g, created=True)
        return g

    def settle(self):
        """Build every deferred gradient now. Called before user code (a hook) runs: a deferred
        gradient still refers to forward arrays, which a hook may update in place (an optimizer
        step run from a post-accumulate hook)."""
        if self.deferred:
            for key in [k for k, g in self.grads.items() if isinstance(g, DeferredGradient)]:
                self.grads[key] = self.pop(key)
                self.owned.add(key)


def _arrays_of(g):
    return () if isinstance(g, DeferredGradient) else (g.data,)


class _GradAssigner:
    """Sets ``.grad`` so that each tensor owns a writeable array that no other gradient shares."""

    def __init__(self, seeds, create_graph):
        self.create_graph = create_graph
        self.handed_out = {id(s.data) for s in seeds}  # the caller's seeds are never handed out

    def assign(self, tensor, g):
        with on_device_of(tensor.data):  # .grad lives with its tensor, whatever GPU is current
            self._assign(tensor, g)

    def _assign(self, tensor, g):
        if tensor.grad is not None:
            if self.create_graph:
                tensor.grad = tensor.grad + g
            else:
                tensor.grad = Tensor._wrap(tensor.grad.data + g.data)
            self.handed_out.add(id(tensor.grad.data))
            return
        a = g.data
        if id(a) in self.handed_out or not _writeable(a) or not _sole_view(a):
            stats["grad_copies"] += 1
            if self.create_graph:
                from .ops.shape import copy as differentiable_copy

                g = differentiable_copy(g)
            else:
                g = Tensor._wrap(array_module(a).array(a, copy=True))
        elif g.creator is not None and not self.create_graph:
            g = Tensor._wrap(a)
        self.handed_out.add(id(g.data))
        tensor.grad = g


def _sole_view(array) -> bool:
    """True when ``array`` owns its memory, or is a view of a base that nothing else refers to.

    A reshaped or transposed gradient (a conv weight's, a linear weight's) is a view of an array
    that backward just made and dropped; it is as good as owned, so it is not copied. CPython's
    reference count tells: the view's ``.base``, the call's argument and the local name are all.
    """
    base = getattr(array, "base", None)
    return base is None or sys.getrefcount(base) <= 3


def _writeable(array) -> bool:
    flags = getattr(array, "flags", None)
    return flags is None or getattr(flags, "writeable", True)


def _key_of(tensor):
    """The key under which gradients for ``tensor`` are summed: its creator node, or itself (a leaf)."""
    return id(tensor.creator) if tensor.creator is not None else id(tensor)


def run_backward(roots, root_grads, targets=None, retain_graph=False, create_graph=False):
    """Propagate ``root_grads`` from ``roots`` back through the graph.

    With ``targets=None`` gradients accumulate into ``.grad`` of leaves (and of tensors that
    called ``retain_grad``). With a list of tensors, returns their gradients (None where
    unreached) and leaves every ``.grad`` alone.
    """
    state = _state
    buffers = _GradientBuffers(create_graph, state.profiler)
    assigner = _GradAssigner(root_grads, create_graph)
    leaves = {}
    for r, g in zip(roots, root_grads):
        buffers.add(_key_of(r), g)
        if r.creator is None:
            leaves[id(r)] = r
    order = _topological_order([r.creator for r in roots if r.creator is not None])
    target_keys = None if targets is None else {_key_of(t): t for t in targets}
    needed = _needed_nodes(order, target_keys) if target_keys is not None else None
    pending = _pending_hooked_leaves(order) if targets is None else None
    captured = {}
    profiler = state.profiler
    with set_grad_enabled(create_graph):
        for fn in order:
            if needed is not None and id(fn) not in needed:
                continue
            with _node_device(fn):  # the node's GPU is current while its gradient is handled
                gy = buffers.pop(id(fn))
                if gy is None:
                    if pending:
                        _finish_hooked_leaves(fn, pending, buffers, assigner)
                    continue
                if fn._hooks:
                    buffers.settle()
                    gy = _run_hooks(fn._hooks, gy)
                if target_keys is not None:
                    if id(fn) in target_keys:
                        captured[id(fn)] = gy
                else:
                    out = fn._output()
                    if out is not None and out._retains_grad:
                        assigner.assign(out, gy)
                fn.check_versions()
                gy_array = gy.data
                start = profiler.clock((gy_array,)) if profiler is not None else 0.0
                previous_node, state.backward_node = state.backward_node, fn
                try:
                    gxs = fn.backward(gy)
                finally:
                    state.backward_node = previous_node
                del gy
                if not isinstance(gxs, tuple):
                    gxs = (gxs,)
                if state.anomaly:  # the checks below read every value
                    gxs = tuple(_materialized(g) for g in gxs)
                if profiler is not None:
                    profiler.record_backward(fn.name, start, gxs, gy_array)
                del gy_array
                for x, gx, need, edge in zip(fn.inputs, gxs, fn.needs_grad, fn.next):
                    if not need or gx is None or edge is None:
                        continue
                    if gx.shape != x.shape:
                        raise GraphError(f"{fn.name}.backward returned a gradient of shape {gx.shape} "
                                         f"for an input of shape {tuple(x.shape)}")
                    if gx.dtype != x.dtype:
                        gx = _materialized(gx).astype(x.dtype)
                    if state.anomaly and _has_nonfinite(gx.data):
                        raise AnomalyError(f"{fn.describe()} produced NaN or Inf in its backward "
                                           f"(gradient of input {tuple(x.shape)})")
                    if not isinstance(edge, Function):
                        leaves[id(edge)] = edge
                    buffers.add(id(edge), gx)
                del gxs
                if pending:
                    _finish_hooked_leaves(fn, pending, buffers, assigner)
                if not retain_graph:
                    fn.release()
        # What is left belongs to leaves, or (for grad()) to targets whose creator was not needed.
        buffers.settle()
        for key in list(buffers.grads):
            owner = leaves.get(key) if target_keys is None else target_keys.get(key)
            if owner is None:
                buffers.pop(key)
                continue
            with on_device_of(owner.data):  # its hooks run on its GPU, as the nodes' do
                g = buffers.pop(key)
                if target_keys is None:
                    assigner.assign(owner, _run_hooks(owner._hooks, g))
                    _run_post_accumulate_hooks(owner)
                else:
                    captured[key] = _run_hooks(owner._hooks, g)
    if targets is not None:
        result = []
        for t in targets:
            g = captured.get(_key_of(t))
            if g is not None:
                owner = Tensor._wrap(t.data)
                assigner.assign(owner, g)  # a private, writeable array for each result
                g = owner.grad
            result.append(g)
        return result
    return None


def _pending_hooked_leaves(order):
    """For each leaf with post-accumulate hooks: how many edges of ``order`` bring it a gradient."""
    counts = {}
    for fn in order:
        for edge, need in zip(fn.next, fn.needs_grad):
            if need and edge is not None and not isinstance(edge, Function) and _post_hooks(edge):
                counts[id(edge)] = counts.get(id(edge), 0) + 1
    return counts


def _node_device(fn):
    """A context making the GPU of ``fn``'s output current (nothing for the CPU)."""
    return fn.output_device if fn.output_device is not None else contextlib.nullcontext()


def _finish_hooked_leaves(fn, pending, buffers, assigner):
    """After ``fn``'s backward: a hooked leaf whose last incoming edge this was gets its ``.grad`` now
    (its gradient is complete), then its post-accumulate hooks run, while backward goes on."""
    for edge, need in zip(fn.next, fn.needs_grad):
        key = id(edge)
        if need and key in pending:
            pending[key] -= 1
            if pending[key] == 0:
                del pending[key]
                g = buffers.pop(key)
                if g is not None:
                    buffers.settle()
                    assigner.assign(edge, _run_hooks(edge._hooks, g))
                    _run_post_accumulate_hooks(edge)


def _post_hooks(tensor):
    return getattr(tensor, "_post_accumulate_hooks", None)


def _run_post_accumulate_hooks(tensor):
    for hook in list(_post_hooks(tensor) or ()):
        hook(tensor)


def _needed_nodes(order, target_keys):
    """Ids of the nodes that lie on a path from the roots to one of the targets."""
    needed = set()
    for fn in reversed(order):  # nodes that made the inputs come first
        for edge in fn.next:
            if edge is not None and (id(edge) in target_keys or id(edge) in needed):
                needed.add(id(fn))
                break
    return needed


def _as_grad_tensor(root, grad, what):
    if grad is None:
        if root.data.size != 1:
            raise GraphError(
                f"{what} of a non-scalar tensor of shape {root.shape} needs an explicit gradient "
                "(grad=... / grad_outputs=...) of the same shape"
            )
        with on_device_of(root.data):  # CuPy allocates on the current GPU unless told otherwise
            return Tensor._wrap(root.xp.ones(root.shape, dtype=root.dtype))
    grad = grad if isinstance(grad, Tensor) else Tensor(grad, dtype=root.dtype, device=root.device)
    if grad.shape != root.shape:
        raise ShapeError(f"{what}: gradient shape {grad.shape} does not match tensor shape {root.shape}")
    if grad.dtype != root.dtype:
        grad = grad.astype(root.dtype)
    return grad


def backward(tensor, grad=None, retain_graph=False, create_graph=False):
    """Accumulate d(tensor)/d(leaf) into every leaf's ``.grad``. See ``Tensor.backward``."""
    if not tensor.requires_grad:
        raise GraphError("backward: the tensor does not require grad and has no graph (created under no_grad, or from constants)")
    g = _as_grad_tensor(tensor, grad, "backward")
    run_backward([tensor], [g], None, retain_graph or create_graph, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    """Gradients of ``outputs`` with respect to ``inputs``, without touching any ``.grad``.

    Args:
        outputs: a Tensor or a sequence of Tensors.
        inputs: a Tensor or a sequence of Tensors (leaves or intermediate results).
        grad_outputs: gradients to seed each output with (required for non-scalar outputs).
        retain_graph: keep the graph for another backward; defaults to ``create_graph``.
        create_graph: record the gradient computation so the results can be differentiated again.
        allow_unused: return None for an input the outputs do not depend on, instead of raising.
    Returns:
        A tuple with one gradient Tensor (shape and dtype of that input) or None per input.
    """
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if grad_outputs is None or isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs] * len(outputs) if grad_outputs is None else [grad_outputs]
    if len(grad_outputs) != len(outputs):
        raise ValueError(f"grad: {len(outputs)} outputs but {len(grad_outputs)} grad_outputs")
    for x in inputs:
        if not x.requires_grad:
            raise GraphError(f"grad: an input of shape {x.shape} does not require grad")
    for y in outputs:
        if not y.requires_grad:
            raise GraphError(f"grad: an output of shape {y.shape} does not require grad and has no graph")
    seeds = [_as_grad_tensor(y, g, "grad") for y, g in zip(outputs, grad_outputs)]
    retain = create_graph if retain_graph is None else retain_graph
    result = run_backward(outputs, seeds, inputs, retain, create_graph)
    for x, g in zip(inputs, result):
        if g is None and not allow_unused:
            raise GraphError(
                f"grad: an input of shape {x.shape} is not used to compute the outputs (pass allow_unused=True)"
            )
    return tuple(result)


from .tensor import Tensor  # noqa: E402  (tensor.py builds on this module; imported last to close the cycle)
