"""Anomaly detection: an observer of the tape that raises AnomalyError at the first op whose
forward or backward output holds NaN or Inf, naming the op, its input shapes and the line of user
code that created it."""
from __future__ import annotations

import contextlib
import os
import traceback

from ..backend import array_module, on_device_of
from ..errors import AnomalyError
from .function import edges
from .grad_mode import _state
from .observers import Observer, observing

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tinygrad_caps/


@contextlib.contextmanager
def detect_anomaly():
    """Context (this thread) in which the first op whose forward or backward output holds NaN/Inf raises AnomalyError.

    The error names the op, the shapes of its inputs and the line of user code that created it.
    Costs a stack walk per op and a finiteness check per output: use it to debug, not to train.
    """
    previous = _state.anomaly
    _state.anomaly = True
    try:
        with observing(_AnomalyChecks()):
            yield
    finally:
        _state.anomaly = previous


class _AnomalyChecks(Observer):
    sees_backward_ops = True  # an op run by a backward is checked as part of that backward
    reads_gradients = True

    def forward_recorded(self, fn, inputs, output, start):
        fn.site = _user_code_site()
        if _has_nonfinite(output.data):
            node = _state.backward_node
            if node is not None:
                raise AnomalyError(f"{node.describe()} produced NaN or Inf in its backward (in {fn.name})")
            raise AnomalyError(f"{fn.describe(inputs)} produced NaN or Inf in its forward output")

    def node_backward(self, fn, grad_output, grads, start):
        # each gradient the walk will pass on, in the walk's order (its cast to the input's dtype,
        # an op, is checked as one)
        for _, gx, _, x, shape_error in edges(fn, grads):
            if shape_error is not None:
                return  # the walk refuses this one first
            if _has_nonfinite(gx.data):
                raise AnomalyError(f"{fn.describe()} produced NaN or Inf in its backward "
                                   f"(gradient of input {tuple(x.shape)})")


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
