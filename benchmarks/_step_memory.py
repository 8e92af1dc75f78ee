"""Device memory of one training step on a GPU, for train_step.py: the peak of what a step allocates
above what was live before it (its activations, gradients, temporaries and workspaces), for ours
(CuPy's memory pool, through routing_speed.py's pool hook) and PyTorch's (its allocator's statistics),
and the bytes a captured step's CUDA graph keeps (``CapturedStep.captured_bytes``).

An eager step frees the last step's gradients (zero_grad) before its backward makes new ones; both
measures drop them before the step (``parameters``), so that the peak counts the step's gradients
as a captured step's graph does, whatever the order of frees and allocations within the step."""
from __future__ import annotations


def drop_gradients(parameters) -> None:
    """Set the ``.grad`` of each parameter (ours or PyTorch's) to None."""
    for p in parameters or ():
        p.grad = None


def ours_step_peak_bytes(step, parameters=None) -> int:
    """Peak bytes live in CuPy's memory pool during one call of ``step`` above those live before it,
    the gradients of ``parameters`` dropped first (a replay of a captured step allocates nothing: 0)."""
    import cupy

    from routing_speed import PoolPeak

    cupy.cuda.Device().synchronize()
    drop_gradients(parameters)
    hook = PoolPeak()
    with hook:
        step()
        cupy.cuda.Device().synchronize()
    return int(hook.peak)


def torch_step_peak_bytes(step, parameters=None) -> int:
    """Peak bytes PyTorch's CUDA allocator holds allocated during one call of ``step`` above those
    allocated before it, the gradients of ``parameters`` dropped first."""
    import torch

    torch.cuda.synchronize()
    drop_gradients(parameters)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - before)


def captured_bytes(runner) -> int | None:
    """The bytes our captured step's graph keeps alive (``CapturedStep.captured_bytes``), or None where
    this CapturedStep does not say."""
    value = getattr(runner, "captured_bytes", None)
    return None if value is None else int(value)
