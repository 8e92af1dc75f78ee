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

Instruments (``tinygrad_caps.profile``, ``detect_anomaly``, your own) watch the tape through one
interface, :class:`Observer`, registered per thread; with none registered they cost an op one
attribute check.

    grad_mode.py   no_grad, enable_grad, set_grad_enabled; the per-thread state (modes, observers)
    function.py    Function: one node; what it saves, the versions it checks; edges(): its edges, filtered once
    engine.py      the walk: topological order, run_backward, and its entry points backward and grad
    deferred.py    DeferredGradient, and the buffers that sum (and merge) the gradients reaching a tensor
    accumulate.py  setting .grad: a writeable array of its own for each tensor
    hooks.py       register_hook hooks and post-accumulate hooks, as the walk runs them
    observers.py   Observer, and registering observers in a thread
    anomaly.py     detect_anomaly: the observer that checks every output for NaN and Inf
"""
from .grad_mode import enable_grad, is_anomaly_enabled, is_grad_enabled, no_grad, set_grad_enabled
from .function import Function
from .deferred import DeferredGradient
from .accumulate import stats
from .observers import GRADIENT_SUMS, Observer, observing, start_observing, stop_observing
from .anomaly import detect_anomaly
from .engine import backward, grad, run_backward
from ..tensor import Tensor

__all__ = [
    "DeferredGradient",
    "Function",
    "GRADIENT_SUMS",
    "Observer",
    "Tensor",
    "backward",
    "detect_anomaly",
    "enable_grad",
    "grad",
    "is_anomaly_enabled",
    "is_grad_enabled",
    "no_grad",
    "observing",
    "run_backward",
    "set_grad_enabled",
    "start_observing",
    "stats",
    "stop_observing",
]
