"""Deferred gradients, and the buffers in which the walk sums the gradients reaching each tensor
(merging the deferred ones that combine)."""
from __future__ import annotations

import numpy as np

from .._parallel import add_into, binary
from ..backend import on_device_of


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


def materialized(g):
    """``g`` as a Tensor: a deferred gradient built, anything else as it is."""
    return g.materialize() if isinstance(g, DeferredGradient) else g


class GradientBuffers:
    """The gradients flowing to each node or leaf, summed as they arrive.

    The first gradient to arrive is stored as it is (it may be another tensor's upstream
    gradient, so it is never written to); the second allocates one sum that this walk owns, and
    every later one is added into that sum in place. Without ``create_graph``, a tensor reached
    by five paths (u_hat in full-gradient routing) costs one new array, not four. Deferred
    gradients that combine (routing's five products into u_hat) wait as one and are built at once.
    Each sum and each build is told to ``observer`` (observers.py), if any.
    """

    def __init__(self, create_graph, observer=None):
        self.create_graph, self.observer = create_graph, observer
        self.grads, self.owned = {}, set()
        self.deferred = 0  # how many entries wait as a DeferredGradient

    def add(self, key, g):
        if key not in self.grads:  # the first gradient to arrive is only stored
            self.grads[key] = g
            self.deferred += isinstance(g, DeferredGradient)
            return
        if self.observer is None:
            self._add(key, g)
            return
        before = self.grads[key]
        start = self.observer.clock(() if isinstance(g, DeferredGradient) else (g.data,))
        self._add(key, g)
        after = self.grads[key]  # a new Tensor when a sum was allocated or a deferred one built
        self.observer.gradient_summed(after, start, created=after is not before)

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
                self.grads[key] = Tensor._wrap(binary(np.add, old.data, materialized(g).data))
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
        start = self.observer.clock() if self.observer is not None else 0.0
        g = g.materialize()
        if self.observer is not None:
            self.observer.gradient_summed(g, start, created=True)
        return g

    def settle(self):
        """Build every deferred gradient now. Called before user code (a hook) runs: a deferred
        gradient still refers to forward arrays, which a hook may update in place (an optimizer
        step run from a post-accumulate hook)."""
        if self.deferred:
            for key in [k for k, g in self.grads.items() if isinstance(g, DeferredGradient)]:
                self.grads[key] = self.pop(key)
                self.owned.add(key)


from ..tensor import Tensor  # noqa: E402  (tensor.py builds on this package; imported last to close the cycle)
