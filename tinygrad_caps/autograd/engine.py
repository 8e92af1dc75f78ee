"""The reverse-mode walk: the nodes in topological order, and for each the gradient of its output
summed, handed to its backward, and the results passed on to the nodes and leaves that made its
inputs. ``backward`` and ``grad`` are its two entry points."""
from __future__ import annotations

import contextlib
import heapq

from ..backend import on_device_of
from ..errors import GraphError, ShapeError
from .accumulate import GradAssigner
from .deferred import GradientBuffers, materialized
from .function import Function, edges
from .grad_mode import _state, set_grad_enabled
from .hooks import post_hooks, run_hooks, run_post_accumulate_hooks


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


def run_backward(roots, root_grads, targets=None, retain_graph=False, create_graph=False):
    """Propagate ``root_grads`` from ``roots`` back through the graph.

    With ``targets=None`` gradients accumulate into ``.grad`` of leaves (and of tensors that
    called ``retain_grad``). With a list of tensors, returns their gradients (None where
    unreached) and leaves every ``.grad`` alone.
    """
    walk = _Walk(root_grads, targets, create_graph)
    for root, g in zip(roots, root_grads):
        walk.receive(root, g)
    order = topological_order([r.creator for r in roots if r.creator is not None])
    needed = walk.plan(order)  # grad(): only the nodes on a path to a target
    with set_grad_enabled(create_graph):
        for fn in order:
            if needed is not None and id(fn) not in needed:
                continue
            with _node_device(fn):  # the node's GPU is current while its gradient is handled
                reached = walk.run_node(fn)
                if walk.pending:  # backward(): leaves whose gradient is complete get it, and their hooks run
                    walk.count_down_hooked_leaves(fn)
                if reached and not retain_graph:
                    fn.release()
        walk.finish()
    return walk.result()


class _Walk:
    """What one ``run_backward`` keeps besides its loop: the gradient buffers, where results go
    (``.grad``, or the targets of ``grad()``), this thread's observer, and for ``backward()`` how
    many edges each leaf with post-accumulate hooks still waits for."""

    def __init__(self, root_grads, targets, create_graph):
        self.observer = _state.observer
        self.buffers = GradientBuffers(create_graph, self.observer)
        self.assigner = GradAssigner(root_grads, create_graph)
        self.targets = targets
        self.target_keys = None if targets is None else {_key_of(t): t for t in targets}
        self.leaves = {}    # id -> leaf for every leaf a gradient reached
        self.captured = {}  # key -> gradient of a target (grad())
        self.pending = None  # id -> edges still to come, per hooked leaf (backward())

    def receive(self, root, g):
        """Seed the walk with gradient ``g`` for ``root``."""
        self.buffers.add(_key_of(root), g)
        if root.creator is None:
            self.leaves[id(root)] = root

    def plan(self, order):
        """The ids of the nodes to run for ``grad()`` (None: all); counts the edges into hooked leaves for ``backward()``."""
        if self.target_keys is not None:
            return _needed_nodes(order, self.target_keys)
        self.pending = _hooked_leaf_edges(order)
        return None

    def run_node(self, fn):
        """Run ``fn``'s backward on the gradient summed for its output and pass the results on;
        False when no gradient reached it (every consumer returned None for it)."""
        gy = self.buffers.pop(id(fn))
        if gy is None:
            return False
        gy = self.output_gradient(fn, gy)
        fn.check_versions()
        gxs = _backward_of(fn, gy) if self.observer is None else self.observed_backward(fn, gy)
        del gy  # a gradient is freed as soon as its node consumed it
        self.pass_on(fn, gxs)
        return True

    def pass_on(self, fn, gxs):
        """Add each gradient in ``gxs`` (``fn``'s backward results) to the sum for the node or leaf
        its edge leads to, in the dtype of the input it is for."""
        for _, gx, edge, x, shape_error in edges(fn, gxs):
            if shape_error is not None:
                raise shape_error
            if gx.dtype != x.dtype:
                gx = materialized(gx).astype(x.dtype)
            if not isinstance(edge, Function):
                self.leaves[id(edge)] = edge
            self.buffers.add(id(edge), gx)

    def count_down_hooked_leaves(self, fn):
        """After ``fn`` ran (or was not reached): a hooked leaf whose last incoming edge this was gets
        its ``.grad`` now (its gradient is complete) and its post-accumulate hooks run, while
        backward goes on."""
        pending = self.pending
        for needed, _, edge, _, _ in edges(fn):
            key = id(edge)
            if needed and key in pending:
                pending[key] -= 1
                if not pending[key]:
                    del pending[key]
                    self.finish_hooked_leaf(edge)

    def finish_hooked_leaf(self, leaf):
        """Give ``leaf`` its complete gradient (deferred ones built first: the hooks may update forward arrays)."""
        g = self.buffers.pop(id(leaf))
        if g is not None:
            self.buffers.settle()
            self.deliver(leaf, g)

    def deliver(self, leaf, g):
        """``leaf.grad`` += ``g`` after its hooks, then its post-accumulate hooks run."""
        self.assigner.assign(leaf, run_hooks(leaf._hooks, g))
        run_post_accumulate_hooks(leaf)

    def output_gradient(self, fn, gy):
        """The gradient of ``fn``'s output after its tensor's hooks; kept as ``.grad`` if the tensor
        retains it, or as a result if it is a target of ``grad()``."""
        if fn._hooks:
            self.buffers.settle()
            gy = run_hooks(fn._hooks, gy)
        if self.target_keys is not None:
            if id(fn) in self.target_keys:
                self.captured[id(fn)] = gy
        else:
            out = fn._output()
            if out is not None and out._retains_grad:
                self.assigner.assign(out, gy)
        return gy

    def observed_backward(self, fn, gy):
        """``fn.backward(gy)`` as a tuple, told to the observer (deferred gradients built first
        if it reads their values)."""
        observer = self.observer
        gy_array = gy.data
        start = observer.clock((gy_array,))
        gxs = _backward_of(fn, gy)
        if observer.reads_gradients:
            gxs = tuple(materialized(g) for g in gxs)
        observer.node_backward(fn, gy_array, gxs, start)
        return gxs

    def finish(self):
        """What is left belongs to leaves, or (for grad()) to targets whose creator was not needed."""
        buffers = self.buffers
        buffers.settle()
        for key in list(buffers.grads):
            owner = self.leaves.get(key) if self.target_keys is None else self.target_keys.get(key)
            if owner is None:
                buffers.pop(key)
                continue
            with on_device_of(owner.data):  # its hooks run on its GPU, as the nodes' do
                g = buffers.pop(key)
                if self.target_keys is None:
                    self.deliver(owner, g)
                else:
                    self.captured[key] = run_hooks(owner._hooks, g)

    def result(self):
        """For ``grad()``: each target's gradient in a private, writeable array (None where unreached)."""
        if self.targets is None:
            return None
        result = []
        for t in self.targets:
            g = self.captured.get(_key_of(t))
            if g is not None:
                owner = Tensor._wrap(t.data)
                self.assigner.assign(owner, g)
                g = owner.grad
            result.append(g)
        return result


def _backward_of(fn, gy):
    """``fn.backward(gy)`` as a tuple, with ``fn`` as this thread's running node meanwhile."""
    state = _state
    previous_node, state.backward_node = state.backward_node, fn
    try:
        gxs = fn.backward(gy)
    finally:
        state.backward_node = previous_node
    return gxs if isinstance(gxs, tuple) else (gxs,)


def topological_order(roots):
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


def _hooked_leaf_edges(order):
    """For each leaf with post-accumulate hooks: how many edges of ``order`` bring it a gradient."""
    counts = {}
    for fn in order:
        for needed, _, edge, _, _ in edges(fn):
            if needed and not isinstance(edge, Function) and post_hooks(edge):
                counts[id(edge)] = counts.get(id(edge), 0) + 1
    return counts


def _needed_nodes(order, target_keys):
    """Ids of the nodes that lie on a path from the roots to one of the targets."""
    needed = set()
    for fn in reversed(order):  # nodes that made the inputs come first
        for edge in fn.next:
            if edge is not None and (id(edge) in target_keys or id(edge) in needed):
                needed.add(id(fn))
                break
    return needed


def _key_of(tensor):
    """The key under which gradients for ``tensor`` are summed: its creator node, or itself (a leaf)."""
    return id(tensor.creator) if tensor.creator is not None else id(tensor)


_ON_CPU = contextlib.nullcontext()  # reusable: one per node would cost the CPU walk an allocation each


def _node_device(fn):
    """A context making the GPU of ``fn``'s output current (nothing for the CPU)."""
    return fn.output_device if fn.output_device is not None else _ON_CPU


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


from ..tensor import Tensor  # noqa: E402  (tensor.py builds on this package; imported last to close the cycle)
