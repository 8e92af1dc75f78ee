"""Setting ``.grad``: each tensor gets a writeable array of its own, copied only when it must be."""
from __future__ import annotations

import sys

from ..backend import array_module, on_device_of

# How many gradient arrays backward copied because they were not its own (a view, read-only, or
# shared with another gradient); reported by benchmarks/engine_overhead.py.
stats = {"grad_copies": 0}


class GradAssigner:
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
                from ..ops.shape import copy as differentiable_copy

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


from ..tensor import Tensor  # noqa: E402  (tensor.py builds on this package; imported last to close the cycle)
