"""A stand-in for the few ``torch`` calls that benchmarks/_torch_variants.py's ``build_graph`` makes,
for tests on a machine without PyTorch or a GPU: ``install(monkeypatch)`` puts it in ``sys.modules``.

It models what matters for the CUDA-graph recipe's buffers: a graph holds raw addresses, not
tensors. A capture records a weak reference to every tensor the captured work reads or writes, and
``replay`` raises :class:`FreedDuringReplay` when one of them was freed (its memory back with the
allocator, which may have handed it to another tensor: on a GPU the replay reads whatever that
tensor holds). Nothing is computed; a loss is a tensor holding a float.
"""
from __future__ import annotations

import contextlib
import types
import weakref


class FreedDuringReplay(RuntimeError):
    """A replay found a tensor it recorded freed."""


_capturing = []  # the graph being captured, if any


class Tensor:
    """A tensor that tells a capture in progress each time it is used."""

    def __init__(self, value=0.0, name="tensor"):
        self.value, self.name = value, name
        self._touch()

    def _touch(self):
        if _capturing:
            _capturing[-1].recorded.append((self.name, weakref.ref(self)))

    def clone(self):
        self._touch()
        return Tensor(self.value, self.name + " (clone)")

    def detach(self):
        return Tensor(self.value, self.name)

    def item(self):
        return float(self.value)

    def backward(self):
        self._touch()


class Model:
    """``model(x, y)`` -> a loss tensor; reads its parameters, x and y."""

    def __init__(self):
        self.weight = Tensor(1.0, "weight")

    def parameters(self):
        return [self.weight]

    def __call__(self, x, y):
        for t in (self.weight, x, y):
            t._touch()
        return Tensor(0.5, "loss")


class Adam:
    """Adam whose state (two moments per parameter) is made at the first step, as PyTorch's is."""

    def __init__(self, params, lr=1e-3, capturable=False):
        self.params, self.state = list(params), []

    def zero_grad(self, set_to_none=True):
        pass

    def step(self):
        if not self.state:
            self.state = [Tensor(0.0, "exp_avg"), Tensor(0.0, "exp_avg_sq")]
        for t in self.params + self.state:
            t._touch()


class CUDAGraph:
    def __init__(self):
        self.recorded = []

    def replay(self):
        for name, ref in self.recorded:
            if ref() is None:
                raise FreedDuringReplay(f"the graph replays on {name}, which was freed after the capture")


class Stream:
    def wait_stream(self, other):
        pass


@contextlib.contextmanager
def _graph(graph):
    _capturing.append(graph)
    try:
        yield
    finally:
        _capturing.pop()


def module() -> types.ModuleType:
    """A ``torch`` module with what build_graph calls."""
    torch = types.ModuleType("torch")
    torch.optim = types.SimpleNamespace(Adam=Adam)
    torch.cuda = types.SimpleNamespace(
        Stream=Stream, current_stream=Stream, stream=lambda s: contextlib.nullcontext(), synchronize=lambda: None,
        empty_cache=lambda: None, memory_reserved=lambda: 0, CUDAGraph=CUDAGraph, graph=_graph)
    return torch


def install(monkeypatch) -> types.ModuleType:
    """Make ``import torch`` give the stand-in for the rest of the test; returns it."""
    torch = module()
    monkeypatch.setitem(__import__("sys").modules, "torch", torch)
    return torch
