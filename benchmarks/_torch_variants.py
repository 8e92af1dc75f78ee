"""PyTorch's CapsNet training step in the forms a researcher who cares about speed runs, for
train_step.py: eager, the whole step captured as one CUDA graph (torch.cuda.CUDAGraph), and
torch.compile in "reduce-overhead" and "max-autotune" modes. Each starts from the weights and batch
it is given (train_step.py gives ours) and reports its first loss, from those weights.

The CUDA graph follows the whole-network capture recipe of PyTorch's CUDA graphs documentation
(https://docs.pytorch.org/docs/stable/notes/cuda.html#whole-network-capture): static inputs, Adam
with ``capturable=True``, three warm-up steps on a side stream, grads set to None before the
capture, then forward, backward and ``optimizer.step()`` captured and replayed. A graph holds raw
addresses, not tensors: every tensor it reads or writes outside its private pool (the static
inputs, the optimizer and its state) is kept alive by the returned step (``TorchStep.buffers``) for
as long as the graph lives. (The first version let them go when ``build_graph`` returned: PyTorch's
allocator then handed the static labels' block to the next eager step's tensors, and the replay's
``one_hot`` scattered with whatever those held: the device-side assert
``ScatterGatherKernel.cu: index out of bounds`` of the H200 run of 2026-11-28; RESULTS.md.)

torch.compile compiles the model (its forward and, through AOTAutograd, its backward; with
"reduce-overhead" and "max-autotune" both run as CUDA graphs) and the optimizer step (as PyTorch's
"compiling the optimizer" recipe does, in the default mode). Compilation (and max-autotune's
autotuning) happens in the first calls; their time is reported apart as ``compile_s`` and may be
cut by a time limit (SIGALRM), after which the variant is skipped with the reason.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable, NamedTuple

VARIANTS = ("eager", "graph", "compile-reduce-overhead", "compile-max-autotune")
COMPILE_MODES = {"compile-reduce-overhead": "reduce-overhead", "compile-max-autotune": "max-autotune"}
WARMUP_STEPS = 3  # before a capture (PyTorch's recipe), and for compile: compile, then record the graphs


class TorchStep(NamedTuple):
    """A built PyTorch step: ``step()`` trains once on the static batch and returns the loss tensor;
    ``first_loss`` the loss of its first step (from the initial weights); ``compile_s`` the seconds of
    compilation and warm-up (None for eager and graph); ``graph_bytes`` the device memory its CUDA graph
    keeps reserved (None without a graph); ``model`` the TorchCapsNet it trains; ``buffers`` what a
    CUDA graph reads and writes outside its own pool ({name: tensor or optimizer}), held here while
    the step lives (None without a graph)."""

    step: Callable
    first_loss: float
    compile_s: float | None = None
    graph_bytes: int | None = None
    model: object = None
    buffers: dict | None = None


class CompileTimeLimit(BaseException):
    """A compile ran past its time limit (a BaseException, so that no ``except Exception`` inside
    torch.compile takes it for a failure to fall back from)."""


def unavailable_reason(variant: str, torch_device: str) -> str | None:
    """Why ``variant`` is not run on ``torch_device`` ("cpu", "cuda:N"), or None when it is."""
    if variant == "eager" or torch_device.startswith("cuda"):
        return None
    if variant == "graph":
        return "CUDA graphs need a GPU; this run is on the CPU"
    return ("torch.compile is not tried on the CPU: its C++ build of this step takes minutes on a small machine, "
            "and the comparison it serves is the GPU's")


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise CompileTimeLimit in this (main) thread after ``seconds``; no limit when None, or off the main thread."""
    if seconds is None or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    if seconds <= 0:
        raise CompileTimeLimit("no time left of the compile budget")

    def expired(signum, frame):
        raise CompileTimeLimit(f"compile and warm-up took over {seconds:.0f} s (what was left of the compile budget)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def build_eager(model, x, y, lr: float = 1e-3) -> TorchStep:
    """PyTorch eager: ``_steps.torch_training_step`` on ``model`` (a TorchCapsNet with the weights to
    start from) and the torch tensors ``x`` (B, 1, 28, 28) and ``y`` (B,); its first step is run here."""
    from _steps import torch_training_step

    step = torch_training_step(model, x, y, lr)
    return TorchStep(step, step().item(), model=model)


def build_graph(model, x, y, lr: float = 1e-3) -> TorchStep:
    """The whole step (forward, backward, capturable Adam) captured as one CUDA graph after
    WARMUP_STEPS eager steps on a side stream; ``graph_bytes``: the growth of PyTorch's reserved memory
    over the capture (the graph's private pool: activations, gradients, workspaces). The returned
    step holds the static inputs (copies of ``x`` and ``y``), the optimizer (its state) and the static
    loss in ``buffers``: the graph replays on their addresses."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=lr, capturable=True)
    static_x, static_y = x.clone(), y.clone()

    def train_once():
        optimizer.zero_grad(set_to_none=True)
        loss = model(static_x, static_y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        losses = [train_once() for _ in range(WARMUP_STEPS)]
    torch.cuda.current_stream().wait_stream(side)
    first_loss = losses[0].item()
    del losses
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = model(static_x, static_y)
        static_loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    graph_bytes = torch.cuda.memory_reserved() - reserved
    # the graph replays on these addresses: none may go back to the allocator while it lives
    buffers = {"static_x": static_x, "static_y": static_y, "optimizer": optimizer, "static_loss": static_loss}

    def replay():
        graph.replay()
        return buffers["static_loss"]

    return TorchStep(replay, first_loss, None, graph_bytes, model, buffers)


def raise_recompile_limits(config) -> None:
    """Every (batch, precision) compiles the model anew: raise Dynamo's recompile limits (named
    ``recompile_limit`` in newer PyTorch, ``cache_size_limit`` before) so that none falls back to eager."""
    for name, least in (("recompile_limit", 64), ("cache_size_limit", 64), ("accumulated_recompile_limit", 512),
                        ("accumulated_cache_size_limit", 512)):
        try:
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), least))
        except Exception:  # noqa: BLE001  (an alias that refuses to be set: its other name is set)
            pass


def build_compiled(model, x, y, variant: str, lr: float = 1e-3, limit_s: float | None = None) -> TorchStep:
    """torch.compile of ``model`` in ``variant``'s mode (COMPILE_MODES) and of Adam's step, compiled
    and warmed up here (WARMUP_STEPS steps) within ``limit_s`` seconds (CompileTimeLimit past them)."""
    import torch
    import torch._dynamo

    raise_recompile_limits(torch._dynamo.config)
    compiled = torch.compile(model, mode=COMPILE_MODES[variant], dynamic=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    @torch.compile(dynamic=False)
    def optimizer_step():
        optimizer.step()

    step_begins = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", lambda: None)

    def step():
        step_begins()  # a new iteration: the CUDA graphs' outputs of the last one may be overwritten
        loss = compiled(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer_step()
        return loss

    start = time.perf_counter()
    with time_limit(limit_s):
        first_loss = step().item()
        for _ in range(WARMUP_STEPS - 1):
            step()
        torch.cuda.synchronize()
    return TorchStep(step, first_loss, time.perf_counter() - start, model=model)
