"""How fast the CPU emulation of our CUDA kernels runs, with CUDA threads as fibers (the default)
and as OS threads (what the sanitizers need), on the same launches, in the same run.

Reports, per kernel: the CUDA threads a launch runs (grid x block), the median seconds per launch
and the CUDA threads per second of each way, and their ratio. The emulation is a test harness:
these figures say how large a shape the tests and the CuPy stand-in can afford, nothing about a GPU.

    python benchmarks/emulation_speed.py [--batch 8] [--repeat 3] [--json]
"""
from __future__ import annotations

import argparse
import json
import platform

import numpy as np
from _timing import time_call

from tinygrad_caps.kernels import capsule, conv, routing
from tinygrad_caps.kernels.checking.emulation import Emulator


def cases(rng, batch):
    """{name: launcher(runner)} at small CapsNet-like sizes (float32): ``batch`` examples of 64
    input capsules; im2col on batch // 4 (at least one) 16-channel 20x20 images."""
    u = rng.standard_normal((batch, 64, 8)).astype(np.float32)
    w = rng.standard_normal((64, 10, 16, 8)).astype(np.float32)
    u_hat = rng.standard_normal((batch, 64, 10, 16)).astype(np.float32)
    c = rng.random((batch, 64, 10)).astype(np.float32)
    x = rng.standard_normal((max(1, batch // 4), 16, 20, 20)).astype(np.float32)
    return {
        "capsule_predict": lambda run: capsule.capsule_predict(u, w, run),
        "capsule_grad": lambda run: capsule.capsule_grad(u_hat, u, w, run),
        "routing_weighted_sum": lambda run: routing.routing_weighted_sum(c, u_hat, run),
        "routing_forward (3 iterations)": lambda run: routing.routing_forward(u_hat, 3, runner=run),
        "im2col (9x9, stride 2)": lambda run: conv.im2col(x, (9, 9), (2, 2), (0, 0), False, run),
    }


def threads_per_call(emulator, call) -> int:
    """The CUDA threads (grid size times block size) of the launches one call makes."""
    before = len(emulator.launches)
    call(emulator)
    return int(sum(np.prod(grid) * np.prod(block) for _, grid, block, _ in emulator.launches[before:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runners = {"fibers": Emulator(os_threads=False), "os_threads": Emulator(os_threads=True)}
    for runner in runners.values():
        runner.libraries()  # build (or load the cached build) before timing
    rows = []
    for name, call in cases(np.random.default_rng(0), args.batch).items():
        row = {"kernel": name}
        for way, runner in runners.items():
            threads = threads_per_call(runner, call)  # also the warm-up
            seconds = time_call(lambda: call(runner), repeat=args.repeat, warmup=0)["median"]
            row.update({"cuda_threads": threads, f"{way}_seconds": seconds, f"{way}_threads_per_s": threads / seconds})
        row["speedup"] = row["os_threads_seconds"] / row["fibers_seconds"]
        rows.append(row)
    result = {"machine": platform.processor() or platform.machine(), "batch": args.batch, "repeat": args.repeat,
              "rows": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"# {result['machine']}, batch {args.batch}, median of {args.repeat}")
    print(f"{'kernel':<32} {'CUDA threads':>12} {'fibers':>10} {'M thr/s':>8} {'OS threads':>11} {'M thr/s':>8} {'ratio':>6}")
    for r in rows:
        print(f"{r['kernel']:<32} {r['cuda_threads']:>12} {r['fibers_seconds'] * 1e3:>8.1f}ms "
              f"{r['fibers_threads_per_s'] / 1e6:>8.2f} {r['os_threads_seconds'] * 1e3:>9.1f}ms "
              f"{r['os_threads_threads_per_s'] / 1e6:>8.3f} {r['speedup']:>6.0f}")


if __name__ == "__main__":
    main()
