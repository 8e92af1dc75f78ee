"""Grad mode, the anomaly flag, and the rest of the tape's per-thread state.

Every mode is thread-local: a new thread starts with grad on, anomaly off and no observers.
``detect_anomaly`` itself lives in anomaly.py, beside the checks it turns on.
"""
from __future__ import annotations

import contextlib
import threading


class _ThreadState(threading.local):
    """Per-thread modes; the class attributes are what every new thread starts with."""

    grad_enabled = True
    anomaly = False
    backward_node = None      # the node whose backward is running in this thread
    observers = ()            # the observers registered in this thread (observers.py), in order
    observer = None           # what an op tells of its forward: None (the fast path), or them all
    backward_observer = None  # the same for an op that a node's backward runs
    scope = None              # the label recorded nodes take (tinygrad_caps.graph.scope), for drawings

    def __init__(self):
        self.previous_grad_modes = []


_state = _ThreadState()


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
