"""Timing helpers shared by the benchmarks: warm up, repeat, report the median and the spread."""
from __future__ import annotations

import statistics
import sys
import time

import tinygrad_caps

# The benchmarks run with the allocator tuned, as the CLI trains (TINYGRAD_CAPS_MALLOC_TUNING=0: off).
tinygrad_caps.tune_allocator()


PYTORCH_MISSING = "PyTorch not installed: its columns are left out (pip install torch==2.13.0 to compare)"


def say_pytorch_missing(json_output: bool = False) -> None:
    """Say once, on stderr when the output is JSON, that the PyTorch columns are left out."""
    print(PYTORCH_MISSING if not json_output else f"# {PYTORCH_MISSING}", file=sys.stderr if json_output else sys.stdout)


def time_call(fn, repeat: int = 5, warmup: int = 1, sync=None) -> dict:
    """Run ``fn`` ``warmup`` times, then ``repeat`` times; returns seconds as median/min/max/all."""
    for _ in range(warmup):
        fn()
        if sync:
            sync()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        samples.append(time.perf_counter() - start)
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "samples": samples}


def time_in_turns(fns: dict, repeat: int = 5, rounds: int = 2, warmup: int = 1, syncs: dict | None = None) -> dict:
    """Time several callables in blocks taken in turns (A A A, B B B, A A A, B B B), each block after
    ``warmup`` untimed calls; returns ``{name: time_call-style dict}`` over all its blocks.

    Blocks, as training runs (one step after another): a step right after another library's step
    pays for that library's work (its OpenMP threads still spinning, caches full of its data).
    Turns: a slower spell of the machine lands on every callable alike.
    """
    syncs = syncs or {}
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name] += time_call(fn, repeat, warmup, syncs.get(name))["samples"]
    return {name: {"median": statistics.median(s), "min": min(s), "max": max(s), "samples": s}
            for name, s in samples.items()}


def describe_allocator() -> str:
    """Which malloc settings this process runs under (the same for every implementation in it)."""
    import os

    from tinygrad_caps import _allocator

    if _allocator.applied:
        return (f"glibc mallopt: mmap and trim thresholds {_allocator.THRESHOLD_BYTES >> 20} MiB, NumPy hugepage "
                f"madvise {'off' if _allocator.hugepage_madvise_disabled else 'on'} (set by tinygrad_caps)")
    env = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    return f"malloc defaults{' with ' + str(env) if env else ''}"


def gpu_events(library: str):
    """(record_start, record_stop, seconds) for a pair of CUDA events of ``library`` ("cupy" or "torch")
    on its current stream: ``seconds()`` waits for the stop event and returns the time between the two."""
    if library == "cupy":
        import cupy

        start, stop = cupy.cuda.Event(), cupy.cuda.Event()

        def seconds():
            stop.synchronize()
            return cupy.cuda.get_elapsed_time(start, stop) / 1e3
    else:
        import torch

        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def seconds():
            stop.synchronize()
            return start.elapsed_time(stop) / 1e3
    return start.record, stop.record, seconds


def host_and_gpu_times(fn, library: str, repeat: int = 5, warmup: int = 1) -> dict:
    """Host and GPU time of each call of ``fn`` (one training step), apart: ``host`` the seconds until
    the call returns (what the host spends issuing the step, before any synchronization), ``gpu`` the
    CUDA-event seconds from before its first launch to after its last, on ``library``'s current stream
    (gaps where the GPU waited for the host included). Returns medians {"host_s", "gpu_s"} and the samples."""
    start, stop, seconds = gpu_events(library)
    for _ in range(warmup):
        start()
        fn()
        stop()
        seconds()
    host, gpu = [], []
    for _ in range(repeat):
        start()
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
        stop()
        gpu.append(seconds())
    return {"host_s": statistics.median(host), "gpu_s": statistics.median(gpu), "host_samples": host,
            "gpu_samples": gpu}
