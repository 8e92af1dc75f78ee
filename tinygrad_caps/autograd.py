"""The tape: one :class:`Function` node per op, and the reverse-mode walk over them.

Each op's output Tensor points to the Function that made it (``creator``); the Function holds
its inputs strongly and its output weakly, so dropping the outputs drops the graph and no global
tape grows. ``backward`` orders the nodes topologically with an explicit stack (no recursion, so
a chain of any length works), sums the gradient arriving at each tensor, runs the tensor's hooks,
and calls each node's ``backward``. Every ``backward`` is written with differentiable ops, so with
``create_graph=True`` the gradients carry a graph of their own and can be differentiated again.
"""
from __future__ import annotations

import contextlib
import functools
import os
import traceback
import weakref

from .backend import array_module, device_of
from .errors import AnomalyError, DeviceError, GraphError, ShapeError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class _Mode:
    grad_enabled = True
    anomaly = False
    backward_node = None  # the node whose backward is running (anomaly reports name it)


def is_grad_enabled() -> bool:
    """True when ops record the graph (not inside ``no_grad``)."""
    return _Mode.grad_enabled


class _GradMode(contextlib.ContextDecorator):
    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        self.previous = _Mode.grad_enabled
        _Mode.grad_enabled = self.enabled
        return self

    def __exit__(self, *exc):
        _Mode.grad_enabled = self.previous
        return False


def no_grad():
    """Context manager and decorator inside which ops record no graph."""
    return _GradMode(False)


def enable_grad():
    """Context manager and decorator that turns recording back on (e.g. inside ``no_grad``)."""
    return _GradMode(True)


def set_grad_enabled(enabled: bool):
    """Context manager: record the graph iff ``enabled``."""
    return _GradMode(bool(enabled))


@contextlib.contextmanager
def detect_anomaly():
    """Context in which the first op whose forward or backward output holds NaN/Inf raises AnomalyError.

    The error names the op, the shapes of its inputs and the line of user code that created it.
    Costs a stack walk per op and a finiteness check per output: use it to debug, not to train.
    """
    previous = _Mode.anomaly
    _Mode.anomaly = True
    try:
        yield
    finally:
        _Mode.anomaly = previous


def _user_code_site() -> str:
    """'file:line in function: code' of the innermost frame outside this package."""
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR):
            return f"{frame.filename}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"
    return "<unknown>"


def _has_nonfinite(array) -> bool:
    if array.dtype.kind not in "fc":
        return False
    return not bool(array_module(array).isfinite(array).all())


class Function:
    """One differentiable op and, once called on inputs that need gradients, one node of the graph.

    Subclasses implement ``forward(*arrays) -> array`` on raw NumPy/CuPy arrays and
    ``backward(grad_output: Tensor) -> Tensor | tuple[Tensor | None, ...]`` with differentiable
    ops. ``self.inputs`` (Tensors), ``self.needs_grad`` (one bool per input) and ``self.output()``
    (the output Tensor) are available in ``backward``.
    """

    released = False
    site = None

    @property
    def name(self) -> str:
        return type(self).__name__

    def __call__(self, *inputs):
        arrays = [x.data for x in inputs]
        if len(arrays) > 1:
            _check_same_device(self.name, arrays)
        if _Mode.anomaly:
            self.site = _user_code_site()
        try:
            y = self.forward(*arrays)
        except ValueError as exc:
            if isinstance(exc, ShapeError):
                raise
            shapes = ", ".join(str(tuple(a.shape)) for a in arrays)
            raise ShapeError(f"{self.name}: {exc} (input shapes {shapes})") from exc
        if _Mode.anomaly and _has_nonfinite(y):
            node = _Mode.backward_node
            if node is not None:
                raise AnomalyError(f"{node.describe()} produced NaN or Inf in its backward (in {self.name})")
            raise AnomalyError(f"{self.describe(inputs)} produced NaN or Inf in its forward output")
        out = Tensor._wrap(y)
        if _Mode.grad_enabled:
            needs = tuple(x.requires_grad for x in inputs)
            if any(needs):
                self.inputs = inputs
                self.needs_grad = needs
                self._output = weakref.ref(out)
                out.creator = self
                out.requires_grad = True
        return out

    def forward(self, *arrays):
        raise NotImplementedError

    def backward(self, grad_output):
        raise NotImplementedError

    def output(self):
        """The output Tensor of this node (alive whenever a gradient flows into it)."""
        out = self._output()
        if out is None:
            raise GraphError(f"{self.name}: its output was freed before backward reached it")
        return out

    def describe(self, inputs=None) -> str:
        inputs = self.inputs if inputs is None else inputs
        shapes = ", ".join(str(tuple(x.shape)) for x in inputs) if inputs is not None else "?"
        where = f", created at {self.site}" if self.site else ""
        return f"op {self.name} (input shapes {shapes}{where})"

    def release(self):
        """Drop what this node holds (inputs, saved arrays); a later backward through it raises GraphError."""
        site = self.site
        vars(self).clear()
        self.released = True
        self.site = site


def _check_same_device(name, arrays):
    first = type(arrays[0])
    for a in arrays[1:]:
        if type(a) is not first and device_of(a) != device_of(arrays[0]):
            raise DeviceError(
                f"{name}: operands are on different devices: {device_of(arrays[0])} and {device_of(a)};"
                " move them with .to(device) first"
            )


def _topological_order(roots):
    """Functions reachable from ``roots``, each before the creators of its inputs (iterative DFS)."""
    order, visited = [], set()
    stack = [(fn, False) for fn in roots]
    while stack:
        fn, finished = stack.pop()
        if finished:
            order.append(fn)
            continue
        if id(fn) in visited:
            continue
        visited.add(id(fn))
        if fn.released:
            raise GraphError(
                f"backward through a graph that was already freed (op {fn.name}); "
                "pass retain_graph=True to the first backward to keep it"
            )
        stack.append((fn, True))
        for x in fn.inputs:
            creator = x.creator
            if creator is not None and id(creator) not in visited:
                stack.append((creator, False))
    order.reverse()
    return order


def _run_hooks(tensor, grad):
    for hook in tensor._hooks or ():
        replaced = hook(grad)
        if replaced is not None:
            grad = replaced
    return grad


def _accumulate(tensor, grad):
    tensor.grad = grad if tensor.grad is None else tensor.grad + grad


def _check_grad_shape(fn, x, gx):
    if gx.shape != x.shape:
        raise GraphError(f"{fn.name}.backward returned a gradient of shape {gx.shape} for an input of shape {x.shape}")


def run_backward(roots, root_grads, targets=None, retain_graph=False, create_graph=False):
    """Propagate ``root_grads`` from ``roots`` back through the graph.

    With ``targets=None`` gradients accumulate into ``.grad`` of leaves (and of tensors that
    called ``retain_grad``). With a list of tensors, returns their gradients (None where
    unreached) and leaves every ``.grad`` alone.
    """
    grads, keep = {}, {}
    for r, g in zip(roots, root_grads):
        grads[id(r)] = grads[id(r)] + g if id(r) in grads else g
        keep[id(r)] = r
    order = _topological_order([r.creator for r in roots if r.creator is not None])
    target_ids = None if targets is None else {id(t) for t in targets}
    needed = _needed_nodes(order, target_ids) if target_ids is not None else None
    captured = {}
    with set_grad_enabled(create_graph):
        for fn in order:
            if needed is not None and id(fn) not in needed:
                continue
            out = fn._output()
            gy = grads.pop(id(out), None) if out is not None else None
            if gy is None:
                continue
            gy = _run_hooks(out, gy)
            if target_ids is not None:
                if id(out) in target_ids:
                    captured[id(out)] = gy
            elif out._retains_grad:
                _accumulate(out, gy)
            if _Mode.anomaly:
                _Mode.backward_node = fn
                try:
                    gxs = fn.backward(gy)
                finally:
                    _Mode.backward_node = None
            else:
                gxs = fn.backward(gy)
            if not isinstance(gxs, tuple):
                gxs = (gxs,)
            for x, gx, need in zip(fn.inputs, gxs, fn.needs_grad):
                if not need or gx is None:
                    continue
                _check_grad_shape(fn, x, gx)
                if _Mode.anomaly and _has_nonfinite(gx.data):
                    raise AnomalyError(f"{fn.describe()} produced NaN or Inf in its backward (gradient of input {x.shape})")
                key = id(x)
                if key in grads:
                    grads[key] = grads[key] + gx
                else:
                    grads[key], keep[key] = gx, x
            if not retain_graph:
                fn.release()
        # What is left belongs to leaves, or (for grad()) to targets whose creator was not needed.
        for key, g in grads.items():
            x = keep[key]
            if target_ids is None:
                _accumulate(x, _run_hooks(x, g))
            elif key in target_ids:
                captured[key] = _run_hooks(x, g)
    if targets is not None:
        return [captured.get(id(t)) for t in targets]
    return None


def _needed_nodes(order, target_ids):
    """Ids of the nodes that lie on a path from the roots to one of the targets."""
    needed = set()
    for fn in reversed(order):  # creators of inputs come first
        for x in fn.inputs:
            if id(x) in target_ids or (x.creator is not None and id(x.creator) in needed):
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
        xp = root.xp
        return Tensor._wrap(xp.ones(root.shape, dtype=root.dtype))
    grad = grad if isinstance(grad, Tensor) else Tensor(grad, dtype=root.dtype, device=root.device)
    if grad.shape != root.shape:
        raise ShapeError(f"{what}: gradient shape {grad.shape} does not match tensor shape {root.shape}")
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
        A tuple with one gradient Tensor (shape of that input) or None per input.
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
