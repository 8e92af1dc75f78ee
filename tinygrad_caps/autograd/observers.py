"""Instruments watch the tape through one interface: :class:`Observer`.

An observer registered in a thread (``with observing(obs):``, or ``start_observing`` and
``stop_observing``) is told of each op's forward, each node's backward and each sum the walk makes
of the gradients reaching one tensor, in that thread. The profiler (``tinygrad_caps.profiler``)
and anomaly detection (anomaly.py) are observers. With none registered, an op pays one attribute
check for all of this and the walk one per backward.
"""
from __future__ import annotations

import contextlib

from .grad_mode import _state

GRADIENT_SUMS = "(gradient sums)"  # the name of the walk's own work: summing the paths into a tensor


class Observer:
    """What the tape tells an instrument. Override what you need; each ``start`` is what
    :meth:`clock` returned just before that work began.

    An observer registered while another of its class is registered takes its place until it
    leaves (so a profile inside a profile records alone).
    """

    sees_backward_ops = False  # also told of the ops a node's backward runs (else only of its node)
    reads_gradients = False    # reads the values of the gradients a backward returns: the walk
                               # builds deferred ones (deferred.py) before telling

    def clock(self, arrays=()) -> float:
        """Called before each forward, node backward and gradient sum; ``arrays`` are what that
        work reads (a profiler may wait for their GPU's queued work first)."""
        return 0.0

    def forward_recorded(self, fn, inputs, output, start) -> None:
        """Op ``fn`` made ``output`` (a Tensor) from ``inputs`` (Tensors) and recorded itself if
        grad mode asked for it."""

    def node_backward(self, fn, grad_output, grads, start) -> None:
        """Node ``fn``'s backward turned ``grad_output`` (an array) into ``grads`` (one Tensor,
        DeferredGradient or None per input), before the walk checks and passes them on."""

    def gradient_summed(self, result, start, created: bool) -> None:
        """The walk added a gradient into the sum for one tensor, or built a deferred one:
        ``result`` is the sum now, ``created`` whether a new array was made for it."""


class _Observers(Observer):
    """Several observers told of each event in the order they were registered."""

    def __init__(self, observers):
        self.observers = observers
        self.sees_backward_ops = any(o.sees_backward_ops for o in observers)
        self.reads_gradients = any(o.reads_gradients for o in observers)

    def clock(self, arrays=()):
        return tuple(o.clock(arrays) for o in self.observers)

    def forward_recorded(self, fn, inputs, output, start):
        for o, s in zip(self.observers, start):
            o.forward_recorded(fn, inputs, output, s)

    def node_backward(self, fn, grad_output, grads, start):
        for o, s in zip(self.observers, start):
            o.node_backward(fn, grad_output, grads, s)

    def gradient_summed(self, result, start, created):
        for o, s in zip(self.observers, start):
            o.gradient_summed(result, s, created)


def _one(observers):
    if not observers:
        return None
    return observers[0] if len(observers) == 1 else _Observers(observers)


def _install(observers: tuple) -> None:
    state = _state
    state.observers = observers
    state.observer = _one(observers)
    state.backward_observer = _one(tuple(o for o in observers if o.sees_backward_ops))


def start_observing(observer: Observer) -> tuple:
    """Register ``observer`` in this thread; returns what ``stop_observing`` restores."""
    previous = _state.observers
    _install(tuple(o for o in previous if type(o) is not type(observer)) + (observer,))
    return previous


def stop_observing(previous: tuple) -> None:
    """Restore the observers that ``start_observing`` found."""
    _install(previous)


@contextlib.contextmanager
def observing(observer: Observer):
    """Within this context (this thread), ``observer`` watches the tape."""
    previous = start_observing(observer)
    try:
        yield observer
    finally:
        stop_observing(previous)
