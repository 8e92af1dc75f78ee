"""Timing helpers shared by the benchmarks: warm up, repeat, report the median and the spread."""
from __future__ import annotations

import statistics
import time

import tinygrad_caps

# The benchmarks run with the allocator tuned, as the CLI trains (TINYGRAD_CAPS_MALLOC_TUNING=0: off).
tinygrad_caps.tune_allocator()


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


def describe_allocator() -> str:
    """Which malloc settings this process runs under (the same for every implementation in it)."""
    import os

    from tinygrad_caps import _allocator

    if _allocator.applied:
        return (f"glibc mallopt: mmap and trim thresholds {_allocator.THRESHOLD_BYTES >> 20} MiB, NumPy hugepage "
                f"madvise {'off' if _allocator.hugepage_madvise_disabled else 'on'} (set by tinygrad_caps)")
    env = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    return f"malloc defaults{' with ' + str(env) if env else ''}"
