"""The hooks the walk runs: ``register_hook`` hooks on the gradient reaching a tensor, and
post-accumulate hooks on a leaf as soon as its ``.grad`` is complete."""
from __future__ import annotations

from .function import Function


def run_hooks(hooks, grad):
    """``grad`` passed through each hook in turn; a hook's non-None return replaces it."""
    for hook in hooks or ():
        replaced = hook(grad)
        if replaced is not None:
            grad = replaced
    return grad


def post_hooks(tensor):
    return getattr(tensor, "_post_accumulate_hooks", None)


def run_post_accumulate_hooks(tensor):
    for hook in list(post_hooks(tensor) or ()):
        hook(tensor)


def pending_hooked_leaves(order):
    """For each leaf with post-accumulate hooks: how many edges of ``order`` bring it a gradient."""
    counts = {}
    for fn in order:
        for edge, need in zip(fn.next, fn.needs_grad):
            if need and edge is not None and not isinstance(edge, Function) and post_hooks(edge):
                counts[id(edge)] = counts.get(id(edge), 0) + 1
    return counts


def finish_hooked_leaves(fn, pending, buffers, assigner):
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
                    assigner.assign(edge, run_hooks(edge._hooks, g))
                    run_post_accumulate_hooks(edge)
